#include "selftest.h"
int ernie4_5_moe_ops_self_test(struct err *e);
int ernie4_5_moe_ops_self_test(struct err *e) { (void)e; return 0; }

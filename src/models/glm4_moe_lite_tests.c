#include "selftest.h"
int glm4_moe_lite_ops_self_test(struct err *e);
int glm4_moe_lite_ops_self_test(struct err *e) { (void)e; return 0; }

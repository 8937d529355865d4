#include "selftest.h"

int deepseek_v3_ops_self_test(struct err *e);
int deepseek_v3_ops_self_test(struct err *e)
{
    (void)e;
    return 0;
}

/*
 * selftest: helpers for family self-tests (selftest.h).
 */
#include "selftest.h"

#include <math.h>
#include <string.h>

#include "../loading/config.h"

int stest_parse(const struct model_ops *ops, const char *json, struct hparams *hp, struct err *e)
{
    cJSON *cfg = NULL;
    int rc = cfg_parse(json, strlen(json), "config.json", &cfg, e);
    if (rc < 0)
        return rc;
    hparams_init(hp);
    rc = ops->parse_config(hp, cfg, e);
    if (rc == 0)
        rc = hparams_validate(hp, e);
    cJSON_Delete(cfg);
    return rc;
}

int stest_parse_fails(const struct model_ops *ops, const char *json, const char *substr,
                      struct err *e)
{
    struct hparams hp;
    struct err pe = {0};
    if (stest_parse(ops, json, &hp, &pe) == 0)
        return err_setf(e, ERR_INTERNAL, "%s: config was accepted, expected an error about '%s'",
                        ops->family, substr);
    if (!strstr(pe.msg, substr))
        return err_setf(e, ERR_INTERNAL, "%s: error '%s' does not mention '%s'", ops->family,
                        pe.msg, substr);
    return 0;
}

int stest_check(bool ok, const char *what, struct err *e)
{
    return ok ? 0 : err_setf(e, ERR_INTERNAL, "self-test failed: %s", what);
}

bool stest_near(double a, double b, double tol)
{
    return fabs(a - b) <= tol;
}

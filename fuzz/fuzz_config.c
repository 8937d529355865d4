/*
 * fuzz_config: libFuzzer target for config.json normalization. The input is
 * parsed as JSON and handed to the registry and to every family's
 * parse_config + hparams_validate, exactly as model_load would; any crash,
 * leak or undefined behaviour is a bug. Accepted configs must also satisfy
 * the invariants the rest of the engine relies on.
 */
#include <stdint.h>
#include <stdlib.h>

#include "loading/config.h"
#include "models/registry.h"

static void check_invariants(const struct hparams *hp)
{
    /* what the forward pass assumes of a validated config */
    if (hp->n_head % hp->n_kv_head != 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0 ||
        hp->n_vocab <= 0 || hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_ff <= 0 ||
        (hp->n_expert > 0 && (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert)))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cJSON *cfg = NULL;
    struct err e = {0};
    if (cfg_parse((const char *)data, size, "fuzz", &cfg, &e) < 0)
        return 0;
    const struct model_ops *ops = NULL;
    (void)registry_resolve(cfg, &ops, &e);
    for (size_t i = 0; i < registry_count(); i++) {
        const struct registry_entry *r = registry_at(i);
        if (!r->ops)
            continue;
        struct hparams hp;
        hparams_init(&hp);
        if (r->ops->parse_config(&hp, cfg, &e) == 0 && hparams_validate(&hp, &e) == 0)
            check_invariants(&hp);
    }
    cJSON_Delete(cfg);
    return 0;
}

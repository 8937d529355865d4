/*
 * fuzz_config: libFuzzer target for config.json normalization. The input is
 * parsed as JSON and handed to the registry and to every family's
 * parse_config + hparams_validate, exactly as model_load would; any crash,
 * leak or undefined behaviour is a bug. Accepted configs must also satisfy
 * the invariants the rest of the engine relies on (recurrent layers included:
 * fuzz/seeds/config/mamba2-chunk-size-0.json was accepted before issue 41's
 * audit).
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
    /* encoders (issue 44): a first position id inside the table, a head no wider than the
     * logits buffer (rope is theirs too since ModernBERT: n_rot is held above) */
    if (hp->encoder && (hp->pos_offset < 0 || hp->pos_offset >= hp->n_ctx || hp->n_cls < 0 ||
                        hp->n_cls > hp->n_vocab || hp->n_type_vocab < 0))
        abort();
    /* recurrent layers (issue 41): a state to carry, and Mamba-2's shape rules */
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        if (ls->kv == KV_RECURRENT && (ls->state_conv < 0 || ls->state_rec < 0 ||
                                      ls->state_conv + ls->state_rec <= 0))
            abort();
        if (ls->mixer == MIXER_MAMBA2 &&
            (hp->ssm.chunk < 1 || hp->ssm.d_state < 1 || hp->ssm.d_conv < 1 || hp->ssm.n_group < 1 ||
             hp->ssm.n_head % hp->ssm.n_group != 0 ||
             (int64_t)hp->ssm.n_head * hp->ssm.head_dim != hp->ssm.d_inner))
            abort();
    }
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

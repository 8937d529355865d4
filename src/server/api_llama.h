/*
 * api_llama: llama-server's native routes (tools/server in llama.cpp) over
 * the same engine as the OpenAI dialect: POST /completion (and /completions),
 * POST /infill, GET and POST /props, GET /slots, with llama-server's request
 * fields, its response objects and its error body
 * {"error": {"code", "message", "type"}}.
 *
 * api_llama.c: /completion and /infill (the request parsed into a struct
 * oai_request and run by gen); api_llama_dialect.c: their answers and streams;
 * api_llama_props.c: /props, /slots and the generation-settings object they
 * share with /completion's answer. Which fields are honoured and which are
 * refused or ignored: docs/server.md ("llama-server's routes"), ADR 0101.
 */
#pragma once
#include <stdbool.h>

#include <cjson/cJSON.h>

#include "../engine/sampler.h"
#include "gen.h"
#include "srv_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The error as llama-server's body (malloc'd; NULL when out of memory): {"error": {"code":
 * status, "message", "type"}} with llama-server's type names (invalid_request_error,
 * authentication_error, not_found_error, permission_error, not_supported_error (501),
 * unavailable_error (503), exceed_context_size_error, server_error). */
char *llama_error_json(const struct oai_error *err);

/* POST /completion, /completions: a prompt (text, token ids or both) completed. */
enum MHD_Result srv_llama_completion(struct server *s, struct MHD_Connection *c, struct srv_req *r);
/* POST /infill: fill-in-the-middle with the tokenizer's FIM tokens (501 without them). */
enum MHD_Result srv_llama_infill(struct server *s, struct MHD_Connection *c, struct srv_req *r);
/* GET /props (post false), POST /props (post true: 501 unless serve --props). */
enum MHD_Result srv_llama_props(struct server *s, struct MHD_Connection *c, struct srv_req *r, bool post);
/* GET /slots: one entry per --parallel sequence (501 with serve --no-slots). */
enum MHD_Result srv_llama_slots(struct server *s, struct MHD_Connection *c, struct srv_req *r);

/* What a generation-settings object describes beyond the sampler's own values. */
struct llama_settings {
    int n_predict;               /* -1: until EOS or the context */
    bool ignore_eos, stream, spec;
    int n_probs;
    const char *const *stop;     /* [n_stop] (NULL: none) */
    int n_stop;
    const struct sampler_bias *bias;  /* [n_bias] */
    int n_bias;
};

/* llama-server's "params" object for sampler values sp and settings x (NULL when out of
 * memory). full: as /completion's generation_settings (with stop, logit_bias, grammar);
 * else as /props' and /slots' params. Samplers this engine does not have are reported with
 * their off values (dry_multiplier 0, mirostat 0, ...), which is what runs. */
cJSON *llama_params_json(const struct sampler_params *sp, const struct llama_settings *x, bool full);

/* The sampling of a /completion that sets none of it: generation_config.json's values, else
 * llama-server's defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty
 * 1); seed 4294967295, llama-server's "random". */
void llama_default_sampling(const struct server_model *m, struct sampler_params *sp);
#define LLAMA_SEED_RANDOM 4294967295u  /* LLAMA_DEFAULT_SEED: a random seed per request */

// ---- between api_llama.c and api_llama_dialect.c ----

/* A growable array of token ids (a prompt). */
struct ids {
    int32_t *p;
    size_t n, cap;
};

/* What the llama dialect needs beyond struct oai_request. */
struct lopts {
    int n_predict;               /* as requested: -1 none */
    int n_probs;
    bool return_tokens;
};

/* The dialect's state of one generation (gen.dstate): owns the prompts. */
struct lstate {
    struct lopts o;
    int *sent;                   /* [n] tokens of each choice streamed */
    struct ids *prompts;         /* [n_prompts]: choice i runs prompts[i / n_cmpl] */
    int n_prompts;
};

void llama_state_free(void *st);
extern const struct gen_dialect llama_dialect;

#ifdef __cplusplus
}
#endif

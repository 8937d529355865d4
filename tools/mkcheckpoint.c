/*
 * mlxcel-mkcheckpoint: write a random-weight checkpoint folder in a published
 * Hugging Face layout, for benchmarks and loader tests at sizes no fixture has.
 *
 *   mlxcel-mkcheckpoint --family llama --hidden 2048 --layers 16 --heads 32 \
 *       --kv-heads 8 --ff 8192 --vocab 32000 --ctx 2048 [--tied] --out DIR
 *   mlxcel-mkcheckpoint --family phixtral --n-embd 2560 --layers 8 --heads 32 \
 *       --experts 4 --top-k 2 --n-inner 10240 --vocab 51200 --rotary-dim 32 \
 *       --ctx 2048 --out DIR
 *
 * Output: config.json, generation_config.json, the weights (model.safetensors,
 * or model-0000i-of-0000n.safetensors shards of at most --max-shard-mib with a
 * model.safetensors.index.json), and optionally tokenizer.json and
 * tokenizer_config.json copied from --tokenizer-from. config.json is written
 * last, so a folder holding it is complete.
 *
 * Values: BF16; matrices ~ N(0, 0.02) (the HF initializer_range), norm weights
 * 1, biases ~ N(0, 0.002). Each tensor draws from its own xoshiro256** stream
 * seeded from (--seed, tensor name), so a tensor's bytes do not depend on the
 * shard size or on the other tensors. Data are generated and written in 4 MiB
 * chunks: memory use is constant whatever the model size.
 *
 * Standalone on purpose (libc + libm only): it must build and run even when
 * the library is mid-change.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* getopt_long; the CMake build defines it already */
#endif
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

/* initializer_range of the HF configs; biases get a tenth so they stay "small" */
#define MK_STD_WEIGHT   0.02f
#define MK_STD_BIAS     0.002f
/* elements generated per write: 2M bf16 = 4 MiB */
#define MK_CHUNK        (2u << 20)
/* the task's shard ceiling; HF's own default is 5 GB, safetensors readers do not care */
#define MK_SHARD_MIB    4096
/* bounds: as hparams.h (HP_MAX_DIM, HP_MAX_LAYERS, HP_MAX_EXPERTS) so every folder loads */
#define MK_MAX_DIM      (1 << 20)
#define MK_MAX_LAYERS   1024
#define MK_MAX_EXPERTS  256
#define MK_MAX_NAME     128

enum mk_family { MK_LLAMA = 0, MK_PHIXTRAL = 1 };
enum mk_init { MK_INIT_WEIGHT = 0, MK_INIT_ONES = 1, MK_INIT_BIAS = 2 };

struct mk_opts {
    enum mk_family family;
    long n_embd, n_layer, n_head, n_kv_head, n_ff, n_vocab, n_ctx;
    long n_expert, n_expert_used, n_rot;
    bool tied;
    uint64_t seed;
    long max_shard_mib;
    const char *out;
    const char *tok_from;
    bool force;
};

struct mk_tensor {
    char name[MK_MAX_NAME];
    int ndim;
    int64_t shape[2];
    enum mk_init init;
    int shard;            /* 0-based shard index */
    uint64_t begin, end;  /* offsets inside the shard's data section */
};

struct mk_list {
    struct mk_tensor *t;  /* [n], owned */
    size_t n, cap;
};

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("mlxcel-mkcheckpoint: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* ---- random numbers ---- */

struct mk_rng {
    uint64_t s[4];
    float spare;
    bool has_spare;
};

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(struct mk_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

/* One stream per tensor: FNV-1a of the name mixed into the seed. */
static void rng_init(struct mk_rng *r, uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    uint64_t x = seed ^ h;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
    r->spare = 0.0f;
    r->has_spare = false;
}

/* Standard normal by Box-Muller; u1 in (0, 1] so log() is finite. */
static float rng_normal(struct mk_rng *r)
{
    if (r->has_spare) {
        r->has_spare = false;
        return r->spare;
    }
    double u1 = ((xoshiro_next(r) >> 11) + 1) * 0x1.0p-53;
    double u2 = (xoshiro_next(r) >> 11) * 0x1.0p-53;
    double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
    r->spare = (float)(rad * sin(th));
    r->has_spare = true;
    return (float)(rad * cos(th));
}

/* f32 -> bf16, round to nearest even (the values here are finite). */
static uint16_t bf16_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---- tensor list ---- */

static void list_add(struct mk_list *l, enum mk_init init, int64_t d0, int64_t d1,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Append one tensor; d1 == 0 makes it a vector [d0]. */
static void list_add(struct mk_list *l, enum mk_init init, int64_t d0, int64_t d1,
                     const char *fmt, ...)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->t = realloc(l->t, l->cap * sizeof *l->t);
        if (!l->t)
            die("out of memory for the tensor list");
    }
    struct mk_tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof t->name)
        die("tensor name too long");
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->init = init;
}

static uint64_t tensor_elems(const struct mk_tensor *t)
{
    return t->ndim == 2 ? (uint64_t)t->shape[0] * (uint64_t)t->shape[1] : (uint64_t)t->shape[0];
}

/* HF LlamaForCausalLM names, in the order transformers saves them. */
static void build_llama(struct mk_list *l, const struct mk_opts *o)
{
    int64_t d = o->n_embd, hd = o->n_embd / o->n_head;
    int64_t qd = o->n_head * hd, kvd = o->n_kv_head * hd;
    list_add(l, MK_INIT_WEIGHT, o->n_vocab, d, "model.embed_tokens.weight");
    for (long il = 0; il < o->n_layer; il++) {
        const char *p = "model.layers";
        list_add(l, MK_INIT_ONES, d, 0, "%s.%ld.input_layernorm.weight", p, il);
        list_add(l, MK_INIT_WEIGHT, qd, d, "%s.%ld.self_attn.q_proj.weight", p, il);
        list_add(l, MK_INIT_WEIGHT, kvd, d, "%s.%ld.self_attn.k_proj.weight", p, il);
        list_add(l, MK_INIT_WEIGHT, kvd, d, "%s.%ld.self_attn.v_proj.weight", p, il);
        list_add(l, MK_INIT_WEIGHT, d, qd, "%s.%ld.self_attn.o_proj.weight", p, il);
        list_add(l, MK_INIT_ONES, d, 0, "%s.%ld.post_attention_layernorm.weight", p, il);
        list_add(l, MK_INIT_WEIGHT, o->n_ff, d, "%s.%ld.mlp.gate_proj.weight", p, il);
        list_add(l, MK_INIT_WEIGHT, o->n_ff, d, "%s.%ld.mlp.up_proj.weight", p, il);
        list_add(l, MK_INIT_WEIGHT, d, o->n_ff, "%s.%ld.mlp.down_proj.weight", p, il);
    }
    list_add(l, MK_INIT_ONES, d, 0, "model.norm.weight");
    if (!o->tied)
        list_add(l, MK_INIT_WEIGHT, o->n_vocab, d, "lm_head.weight");
}

/* The published mlabonne/phixtral-* (phi-msft) names: per-expert fc1/fc2. */
static void build_phixtral(struct mk_list *l, const struct mk_opts *o)
{
    int64_t d = o->n_embd, f = o->n_ff;
    list_add(l, MK_INIT_WEIGHT, o->n_vocab, d, "transformer.embd.wte.weight");
    for (long il = 0; il < o->n_layer; il++) {
        const char *p = "transformer.h";
        list_add(l, MK_INIT_ONES, d, 0, "%s.%ld.ln.weight", p, il);
        list_add(l, MK_INIT_BIAS, d, 0, "%s.%ld.ln.bias", p, il);
        list_add(l, MK_INIT_WEIGHT, 3 * d, d, "%s.%ld.mixer.Wqkv.weight", p, il);
        list_add(l, MK_INIT_BIAS, 3 * d, 0, "%s.%ld.mixer.Wqkv.bias", p, il);
        list_add(l, MK_INIT_WEIGHT, d, d, "%s.%ld.mixer.out_proj.weight", p, il);
        list_add(l, MK_INIT_BIAS, d, 0, "%s.%ld.mixer.out_proj.bias", p, il);
        list_add(l, MK_INIT_WEIGHT, o->n_expert, d, "%s.%ld.moe.gate.weight", p, il);
        for (long x = 0; x < o->n_expert; x++) {
            list_add(l, MK_INIT_WEIGHT, f, d, "%s.%ld.moe.mlp.%ld.fc1.weight", p, il, x);
            list_add(l, MK_INIT_BIAS, f, 0, "%s.%ld.moe.mlp.%ld.fc1.bias", p, il, x);
            list_add(l, MK_INIT_WEIGHT, d, f, "%s.%ld.moe.mlp.%ld.fc2.weight", p, il, x);
            list_add(l, MK_INIT_BIAS, d, 0, "%s.%ld.moe.mlp.%ld.fc2.bias", p, il, x);
        }
    }
    list_add(l, MK_INIT_ONES, d, 0, "lm_head.ln.weight");
    list_add(l, MK_INIT_BIAS, d, 0, "lm_head.ln.bias");
    list_add(l, MK_INIT_WEIGHT, o->n_vocab, d, "lm_head.linear.weight");
    list_add(l, MK_INIT_BIAS, o->n_vocab, 0, "lm_head.linear.bias");
}

/* Greedy packing in list order; a tensor larger than the cap gets a shard of its
 * own (as transformers does). Returns the number of shards. */
static int assign_shards(struct mk_list *l, uint64_t cap)
{
    int shard = 0;
    uint64_t used = 0;
    for (size_t i = 0; i < l->n; i++) {
        struct mk_tensor *t = &l->t[i];
        uint64_t bytes = tensor_elems(t) * 2;
        if (used > 0 && used + bytes > cap) {
            shard++;
            used = 0;
        }
        t->shard = shard;
        t->begin = used;
        t->end = used + bytes;
        used += bytes;
    }
    return shard + 1;
}

/* ---- writing ---- */

static void shard_name(char *buf, size_t cap, int i, int n)
{
    if (n == 1)
        snprintf(buf, cap, "model.safetensors");
    else
        snprintf(buf, cap, "model-%05d-of-%05d.safetensors", i + 1, n);
}

static FILE *open_out(const char *dir, const char *name, char *path, size_t cap)
{
    if ((size_t)snprintf(path, cap, "%s/%s", dir, name) >= cap)
        die("path too long: %s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        die("cannot create %s: %s", path, strerror(errno));
    return f;
}

static void close_out(FILE *f, const char *path)
{
    if (ferror(f) | (fclose(f) != 0))
        die("write error on %s: %s", path, strerror(errno));
}

/* The safetensors header of one shard, padded with spaces to a multiple of 8
 * (as the reference writer does) so the data section starts aligned.
 * Returns a malloc'd buffer of *len bytes. */
static char *shard_header(const struct mk_list *l, int shard, size_t *len)
{
    size_t cap = 64, n = 0;
    for (size_t i = 0; i < l->n; i++)
        cap += strlen(l->t[i].name) + 128;
    char *h = malloc(cap + 8);
    if (!h)
        die("out of memory for a header");
    n += (size_t)sprintf(h + n, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < l->n; i++) {
        const struct mk_tensor *t = &l->t[i];
        if (t->shard != shard)
            continue;
        n += (size_t)sprintf(h + n, ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[%" PRId64, t->name,
                             t->shape[0]);
        if (t->ndim == 2)
            n += (size_t)sprintf(h + n, ",%" PRId64, t->shape[1]);
        n += (size_t)sprintf(h + n, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", t->begin,
                             t->end);
    }
    h[n++] = '}';
    while (n % 8)
        h[n++] = ' ';
    *len = n;
    return h;
}

/* Generate one tensor chunk by chunk into buf and append it to f. */
static void write_tensor(FILE *f, const char *path, const struct mk_tensor *t, uint64_t seed,
                         uint16_t *buf)
{
    struct mk_rng r;
    uint64_t left = tensor_elems(t);
    float std = t->init == MK_INIT_BIAS ? MK_STD_BIAS : MK_STD_WEIGHT;
    rng_init(&r, seed, t->name);
    while (left > 0) {
        size_t n = left < MK_CHUNK ? (size_t)left : MK_CHUNK;
        for (size_t i = 0; i < n; i++)
            buf[i] = t->init == MK_INIT_ONES ? 0x3f80 : bf16_from_f32(std * rng_normal(&r));
        /* safetensors is little-endian, as is every target of this tool (x86-64) */
        if (fwrite(buf, sizeof *buf, n, f) != n)
            die("write error on %s: %s", path, strerror(errno));
        left -= n;
    }
}

static void write_shard(const struct mk_opts *o, const struct mk_list *l, int shard, int n_shards,
                        uint16_t *buf)
{
    char name[64], path[4096];
    size_t hlen;
    shard_name(name, sizeof name, shard, n_shards);
    char *h = shard_header(l, shard, &hlen);
    FILE *f = open_out(o->out, name, path, sizeof path);
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    if (fwrite(le, 1, 8, f) != 8 || fwrite(h, 1, hlen, f) != hlen)
        die("write error on %s: %s", path, strerror(errno));
    free(h);
    for (size_t i = 0; i < l->n; i++)
        if (l->t[i].shard == shard)
            write_tensor(f, path, &l->t[i], o->seed, buf);
    close_out(f, path);
    fprintf(stderr, "wrote %s\n", path);
}

static void write_index(const struct mk_opts *o, const struct mk_list *l, int n_shards)
{
    char path[4096], name[64];
    uint64_t total = 0;
    for (size_t i = 0; i < l->n; i++)
        total += tensor_elems(&l->t[i]) * 2;
    FILE *f = open_out(o->out, "model.safetensors.index.json", path, sizeof path);
    fprintf(f, "{\n  \"metadata\": {\"total_size\": %" PRIu64 "},\n  \"weight_map\": {\n", total);
    for (size_t i = 0; i < l->n; i++) {
        shard_name(name, sizeof name, l->t[i].shard, n_shards);
        fprintf(f, "    \"%s\": \"%s\"%s\n", l->t[i].name, name, i + 1 < l->n ? "," : "");
    }
    fputs("  }\n}\n", f);
    close_out(f, path);
}

static void write_config_llama(FILE *f, const struct mk_opts *o)
{
    fprintf(f,
            "{\n"
            "  \"_name_or_path\": \"mlxcel-mkcheckpoint-llama\",\n"
            "  \"architectures\": [\"LlamaForCausalLM\"],\n"
            "  \"model_type\": \"llama\",\n"
            "  \"vocab_size\": %ld,\n"
            "  \"hidden_size\": %ld,\n"
            "  \"intermediate_size\": %ld,\n"
            "  \"num_hidden_layers\": %ld,\n"
            "  \"num_attention_heads\": %ld,\n"
            "  \"num_key_value_heads\": %ld,\n"
            "  \"head_dim\": %ld,\n"
            "  \"hidden_act\": \"silu\",\n"
            "  \"max_position_embeddings\": %ld,\n"
            "  \"rms_norm_eps\": 1e-05,\n"
            "  \"rope_theta\": 500000.0,\n"
            "  \"tie_word_embeddings\": %s,\n"
            "  \"attention_bias\": false,\n"
            "  \"mlp_bias\": false,\n"
            "  \"initializer_range\": 0.02,\n"
            "  \"torch_dtype\": \"bfloat16\",\n"
            "  \"bos_token_id\": 0,\n"
            "  \"eos_token_id\": 0\n"
            "}\n",
            o->n_vocab, o->n_embd, o->n_ff, o->n_layer, o->n_head, o->n_kv_head,
            o->n_embd / o->n_head, o->n_ctx, o->tied ? "true" : "false");
}

static void write_config_phixtral(FILE *f, const struct mk_opts *o)
{
    fprintf(f,
            "{\n"
            "  \"_name_or_path\": \"mlxcel-mkcheckpoint-phixtral\",\n"
            "  \"architectures\": [\"PhiForCausalLM\"],\n"
            "  \"model_type\": \"phi-msft\",\n"
            "  \"activation_function\": \"gelu_new\",\n"
            "  \"n_embd\": %ld,\n"
            "  \"n_head\": %ld,\n"
            "  \"n_head_kv\": null,\n"
            "  \"n_inner\": %ld,\n"
            "  \"n_layer\": %ld,\n"
            "  \"n_positions\": %ld,\n"
            "  \"rotary_dim\": %ld,\n"
            "  \"vocab_size\": %ld,\n"
            "  \"layer_norm_epsilon\": 1e-05,\n"
            "  \"num_local_experts\": %ld,\n"
            "  \"num_experts_per_tok\": %ld,\n"
            "  \"tie_word_embeddings\": false,\n"
            "  \"initializer_range\": 0.02,\n"
            "  \"torch_dtype\": \"bfloat16\",\n"
            "  \"bos_token_id\": 0,\n"
            "  \"eos_token_id\": 0\n"
            "}\n",
            o->n_embd, o->n_head, o->n_ff, o->n_layer, o->n_ctx, o->n_rot, o->n_vocab, o->n_expert,
            o->n_expert_used);
}

/* Written last: its presence marks a complete folder. */
static void write_configs(const struct mk_opts *o)
{
    char path[4096];
    FILE *f = open_out(o->out, "generation_config.json", path, sizeof path);
    fputs("{\n  \"bos_token_id\": 0,\n  \"eos_token_id\": 0,\n  \"do_sample\": false\n}\n", f);
    close_out(f, path);
    f = open_out(o->out, "config.json", path, sizeof path);
    if (o->family == MK_LLAMA)
        write_config_llama(f, o);
    else
        write_config_phixtral(f, o);
    close_out(f, path);
}

/* Copy src_dir/name into the output folder; a missing optional file is skipped. */
static void copy_file(const struct mk_opts *o, const char *name, bool required)
{
    char src[4096], dst[4096], buf[1 << 16];
    if ((size_t)snprintf(src, sizeof src, "%s/%s", o->tok_from, name) >= sizeof src)
        die("path too long: %s/%s", o->tok_from, name);
    FILE *in = fopen(src, "rb");
    if (!in) {
        if (required || errno != ENOENT)
            die("cannot open %s: %s", src, strerror(errno));
        return;
    }
    FILE *out = open_out(o->out, name, dst, sizeof dst);
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n)
            die("write error on %s: %s", dst, strerror(errno));
    if (ferror(in))
        die("read error on %s: %s", src, strerror(errno));
    fclose(in);
    close_out(out, dst);
}

/* ---- arguments ---- */

static const char *k_help =
    "usage: mlxcel-mkcheckpoint --family llama|phixtral [dims] --out DIR [options]\n"
    "\n"
    "llama:    --hidden H --layers L --heads N --kv-heads K --ff F --vocab V --ctx C [--tied]\n"
    "phixtral: --n-embd D --layers L --heads N --experts E --top-k K --n-inner I\n"
    "          --vocab V --rotary-dim R --ctx C\n"
    "          (--hidden and --n-embd, --ff and --n-inner are synonyms)\n"
    "\n"
    "  --out DIR              output folder (created; must be empty unless --force)\n"
    "  --seed S               RNG seed (default 0)\n"
    "  --max-shard-mib N      largest shard in MiB (default 4096); more data -> shards + index\n"
    "  --tokenizer-from DIR   copy tokenizer.json (+ tokenizer_config.json) from DIR\n"
    "  --force                write into a non-empty DIR\n"
    "  -h, --help             show this help\n";

enum {
    OPT_FAMILY = 256, OPT_EMBD, OPT_LAYERS, OPT_HEADS, OPT_KV_HEADS, OPT_FF, OPT_VOCAB, OPT_CTX,
    OPT_TIED, OPT_EXPERTS, OPT_TOPK, OPT_ROT, OPT_OUT, OPT_SEED, OPT_SHARD, OPT_TOK, OPT_FORCE,
};

/* A decimal integer in [lo, hi], else die naming the flag. */
static long parse_long(const char *flag, const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        die("%s: '%s' is not an integer in [%ld, %ld]", flag, s, lo, hi);
    return v;
}

static void parse_args(int argc, char **argv, struct mk_opts *o)
{
    static const struct option opts[] = {
        {"family", required_argument, 0, OPT_FAMILY}, {"hidden", required_argument, 0, OPT_EMBD},
        {"n-embd", required_argument, 0, OPT_EMBD}, {"layers", required_argument, 0, OPT_LAYERS},
        {"heads", required_argument, 0, OPT_HEADS}, {"kv-heads", required_argument, 0, OPT_KV_HEADS},
        {"ff", required_argument, 0, OPT_FF}, {"n-inner", required_argument, 0, OPT_FF},
        {"vocab", required_argument, 0, OPT_VOCAB}, {"ctx", required_argument, 0, OPT_CTX},
        {"tied", no_argument, 0, OPT_TIED}, {"experts", required_argument, 0, OPT_EXPERTS},
        {"top-k", required_argument, 0, OPT_TOPK}, {"rotary-dim", required_argument, 0, OPT_ROT},
        {"out", required_argument, 0, OPT_OUT}, {"seed", required_argument, 0, OPT_SEED},
        {"max-shard-mib", required_argument, 0, OPT_SHARD},
        {"tokenizer-from", required_argument, 0, OPT_TOK}, {"force", no_argument, 0, OPT_FORCE},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    const char *family = NULL;
    char f[64];   /* the flag being parsed, for messages */
    int c, idx;
    opterr = 0;
    while ((idx = -1, c = getopt_long(argc, argv, ":h", opts, &idx)) != -1) {
        if (idx >= 0)
            snprintf(f, sizeof f, "--%s", opts[idx].name);
        else
            snprintf(f, sizeof f, "%s", argv[optind - 1]);
        switch (c) {
        case OPT_FAMILY: family = optarg; break;
        case OPT_EMBD: o->n_embd = parse_long(f, optarg, 1, MK_MAX_DIM); break;
        case OPT_LAYERS: o->n_layer = parse_long(f, optarg, 1, MK_MAX_LAYERS); break;
        case OPT_HEADS: o->n_head = parse_long(f, optarg, 1, MK_MAX_DIM); break;
        case OPT_KV_HEADS: o->n_kv_head = parse_long(f, optarg, 1, MK_MAX_DIM); break;
        case OPT_FF: o->n_ff = parse_long(f, optarg, 1, MK_MAX_DIM); break;
        case OPT_VOCAB: o->n_vocab = parse_long(f, optarg, 1, MK_MAX_DIM); break;
        case OPT_CTX: o->n_ctx = parse_long(f, optarg, 1, MK_MAX_DIM); break;
        case OPT_TIED: o->tied = true; break;
        case OPT_EXPERTS: o->n_expert = parse_long(f, optarg, 1, MK_MAX_EXPERTS); break;
        case OPT_TOPK: o->n_expert_used = parse_long(f, optarg, 1, MK_MAX_EXPERTS); break;
        case OPT_ROT: o->n_rot = parse_long(f, optarg, 0, MK_MAX_DIM); break;
        case OPT_OUT: o->out = optarg; break;
        case OPT_SEED: o->seed = (uint64_t)parse_long(f, optarg, 0, INT64_MAX); break;
        case OPT_SHARD: o->max_shard_mib = parse_long(f, optarg, 1, 1L << 30); break;
        case OPT_TOK: o->tok_from = optarg; break;
        case OPT_FORCE: o->force = true; break;
        case 'h': fputs(k_help, stdout); exit(0);
        case ':': die("option %s needs a value", f);
        default: die("unknown option %s (see --help)", f);
        }
    }
    if (optind < argc)
        die("unexpected argument '%s'", argv[optind]);
    if (!family)
        die("--family llama|phixtral is required");
    if (strcmp(family, "llama") == 0)
        o->family = MK_LLAMA;
    else if (strcmp(family, "phixtral") == 0 || strcmp(family, "phi-msft") == 0)
        o->family = MK_PHIXTRAL;
    else
        die("--family '%s': expected llama or phixtral", family);
    if (!o->out)
        die("--out DIR is required");
}

static void require(long v, const char *flag)
{
    if (v <= 0)
        die("%s is required for this family", flag);
}

/* The shape rules the loader checks, reported here by flag name. */
static void validate(const struct mk_opts *o)
{
    bool llama = o->family == MK_LLAMA;
    require(o->n_embd, llama ? "--hidden" : "--n-embd");
    require(o->n_layer, "--layers");
    require(o->n_head, "--heads");
    require(o->n_ff, llama ? "--ff" : "--n-inner");
    require(o->n_vocab, "--vocab");
    require(o->n_ctx, "--ctx");
    if (o->n_embd % o->n_head)
        die("hidden size %ld is not divisible by --heads %ld", o->n_embd, o->n_head);
    long hd = o->n_embd / o->n_head;
    if (llama) {
        require(o->n_kv_head, "--kv-heads");
        if (o->n_expert || o->n_expert_used || o->n_rot)
            die("--experts, --top-k and --rotary-dim are phixtral options");
        if (o->n_head % o->n_kv_head)
            die("--heads %ld is not a multiple of --kv-heads %ld", o->n_head, o->n_kv_head);
        if (hd % 2)
            die("head_dim %ld must be even for RoPE", hd);
        return;
    }
    require(o->n_expert, "--experts");
    require(o->n_expert_used, "--top-k");
    if (o->n_kv_head || o->tied)
        die("--kv-heads and --tied are llama options (phi-msft has n_head_kv = n_head, untied head)");
    if (o->n_expert_used > o->n_expert)
        die("--top-k %ld exceeds --experts %ld", o->n_expert_used, o->n_expert);
    if (o->n_rot % 2 || o->n_rot > hd)
        die("--rotary-dim %ld must be even and at most head_dim %ld", o->n_rot, hd);
}

/* Create the output folder; an existing one must be empty unless --force. */
static void prepare_out(const struct mk_opts *o)
{
    if (mkdir(o->out, 0755) == 0)
        return;
    if (errno != EEXIST)
        die("cannot create %s: %s", o->out, strerror(errno));
    DIR *d = opendir(o->out);
    if (!d)
        die("%s exists and is not a readable folder", o->out);
    struct dirent *de;
    bool empty = true;
    while ((de = readdir(d)) != NULL)
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
            empty = false;
    closedir(d);
    if (!empty && !o->force)
        die("%s is not empty (use --force to overwrite)", o->out);
}

/* Remove shards of an earlier run with another shard count (with --force). */
static void remove_stale(const struct mk_opts *o)
{
    DIR *d = opendir(o->out);
    struct dirent *de;
    char path[4096];
    if (!d)
        return;
    while ((de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        bool st = n > 12 && strcmp(de->d_name + n - 12, ".safetensors") == 0;
        if ((st || strcmp(de->d_name, "model.safetensors.index.json") == 0 ||
             strcmp(de->d_name, "config.json") == 0) &&
            (size_t)snprintf(path, sizeof path, "%s/%s", o->out, de->d_name) < sizeof path)
            remove(path);
    }
    closedir(d);
}

int main(int argc, char **argv)
{
    struct mk_opts o = {.max_shard_mib = MK_SHARD_MIB};
    struct mk_list l = {0};
    parse_args(argc, argv, &o);
    validate(&o);

    if (o.family == MK_LLAMA)
        build_llama(&l, &o);
    else
        build_phixtral(&l, &o);
    prepare_out(&o);
    int n_shards = assign_shards(&l, (uint64_t)o.max_shard_mib << 20);
    uint64_t params = 0;
    for (size_t i = 0; i < l.n; i++)
        params += tensor_elems(&l.t[i]);
    fprintf(stderr, "%zu tensors, %" PRIu64 " parameters, %.2f GB bf16 in %d file(s)\n", l.n,
            params, params * 2 / 1e9, n_shards);

    if (o.force)
        remove_stale(&o);
    uint16_t *buf = malloc(MK_CHUNK * sizeof *buf);
    if (!buf)
        die("out of memory for the write buffer");
    for (int s = 0; s < n_shards; s++)
        write_shard(&o, &l, s, n_shards, buf);
    free(buf);
    if (n_shards > 1)
        write_index(&o, &l, n_shards);
    if (o.tok_from) {
        copy_file(&o, "tokenizer.json", true);
        copy_file(&o, "tokenizer_config.json", false);
    }
    write_configs(&o);
    free(l.t);
    return 0;
}

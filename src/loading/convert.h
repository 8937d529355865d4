/*
 * convert: writing MLX-format checkpoints, as mlx-lm's `convert` does, from
 * a Hugging Face folder (convert_checkpoint) or from any tensor source
 * (ck_plan + ck_write, which `mlxcel synth` feeds with random numbers).
 *
 * Pipeline: input tensors (name, dtype, shape, an opaque handle) ->
 * ck_plan: per-expert tensors matching a family's expert_stack_rule become
 * one stacked [E, ...] tensor (mlx-lm's sanitize), every float tensor takes
 * the target dtype, and with quantization every `.weight` of >= 2 dims whose
 * last dim divides the group size is marked for quantizing (mlx-lm's rule:
 * Linear, Embedding and SwitchLinear weights, routers included; norms, even
 * 2-D per-head ones, and `.bias` vectors never), then the family's
 * predicate may keep it float or give it its own parameters -> ck_write: P.weight becomes P.weight (U32),
 * P.scales and (affine) P.biases; all entries are written sorted by name
 * into one model.safetensors, streaming: float tensors in chunks, a
 * quantized tensor held (packed) only while its three entries are written.
 *
 * This module knows no family: the caller passes the stacking rules and the
 * names to drop (a tied lm_head).
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "../core/dtype.h"
#include "../core/err.h"
#include "../core/safetensors.h"
#include "outdir.h"
#include "quantize.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mlx-lm sanitize for MoE experts: tensors PER_EXPERT.<suffix> (a printf format taking
 * the layer and the expert index, e.g. "transformer.h.%d.moe.mlp.%d.fc1") for experts
 * 0..E-1 become one STACKED.<suffix> (format taking the layer) of shape [E, ...]. A
 * family's table ends with {NULL, NULL}. */
struct expert_stack_rule {
    const char *per_expert;
    const char *stacked;
};

/* mlx-lm sanitize steps that reorder one tensor (gpt-oss's experts in transformers'
 * layout, DeepSeek-V3's kv_b_proj split into embed_q / unembed_out): the input named `in`
 * (a printf format taking the layer) becomes the output `out` (same format) through
 * `view`. One input may feed several outputs. */
enum ck_view {
    CK_VIEW_NONE = 0,
    CK_VIEW_T,          /* [E, A, B] -> [E, B, A] */
    CK_VIEW_T_EVEN,     /* [E, A, 2C] -> [E, C, A]: the even columns, transposed */
    CK_VIEW_T_ODD,      /* [E, A, 2C] -> [E, C, A]: the odd columns, transposed */
    CK_VIEW_EVEN,       /* [E, 2C] -> [E, C]: the even columns */
    CK_VIEW_ODD,        /* [E, 2C] -> [E, C]: the odd columns */
    CK_VIEW_RENAME,     /* unchanged, renamed */
    CK_VIEW_HEAD_K_T,   /* [H * (a + b), C] -> [H, C, a]: each head's first a rows, transposed */
    CK_VIEW_HEAD_V,     /* [H * (a + b), C] -> [H, b, C]: each head's last b rows */
    CK_VIEW_T_LO,       /* [E, A, 2C] -> [E, C, A]: the first C columns, transposed (Llama 4) */
    CK_VIEW_T_HI,       /* [E, A, 2C] -> [E, C, A]: the last C columns, transposed */
};
struct ck_view_rule {
    const char *in, *out;
    enum ck_view view;
    int a, b;           /* the head split of CK_VIEW_HEAD_* (DeepSeek's nope / v rows) */
};
/* Most rules a family's convert_views writes (the {NULL} end included). */
#define CK_MAX_VIEWS 16

/* mlx-lm's quant_predicate of a family (its model's `quant_predicate` property), asked
 * for every tensor the generic rule would quantize with base, by module name (the output
 * name without ".weight"): CK_Q_FLOAT keeps it float (a module mlx-lm cannot quantize, such
 * as DeepSeek's MoEGate), CK_Q_DEFAULT quantizes it with base, CK_Q_OVERRIDE with *qp,
 * written as a per-module entry of config.json's quantization (the router at 8 bits). */
#define CK_Q_FLOAT    0
#define CK_Q_DEFAULT  1
#define CK_Q_OVERRIDE 2
typedef int (*ck_quant_predicate_fn)(const char *module, const struct quant_params *base,
                                     struct quant_params *qp);

/* One input tensor. handle is passed back to the reader untouched. */
struct ck_input {
    const char *name;   /* borrowed for ck_plan's duration */
    enum dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *handle;
};

/* One output tensor before quantization. */
struct ck_tensor {
    char *name;                  /* output name, owned */
    enum dtype dtype;            /* output dtype (input of the quantizer) */
    int ndim;
    int64_t shape[ST_MAX_DIMS];  /* stacked: [E, part shape...] */
    int n_parts;                 /* 1, or E stacked parts */
    const void **parts;          /* [n_parts] reader handles, owned array */
    bool quantize;
    bool has_qp;                 /* quantized with qp (a per-module entry), not the default */
    struct quant_params qp;
    enum ck_view view;           /* != NONE: parts[0] (shape src_shape) reordered */
    int64_t src_shape[3];        /* 2-D sources as [1 or heads, rows, cols] */
    int head_a;                  /* CK_VIEW_HEAD_*: rows of each head before the split */
};

/* Reads elements [elem0, elem0 + n) of one part, converted to dt, into dst. */
struct ck_reader {
    int (*read)(void *ud, const void *handle, enum dtype dt, int64_t elem0, int64_t n, void *dst,
                struct err *e);
    void *ud;
};

/* Called after every written piece: bytes written so far and in total. */
typedef void (*ck_progress_fn)(void *ud, uint64_t done, uint64_t total);

struct ck_plan_opts {
    const struct expert_stack_rule *rules;  /* NULL: no stacking */
    int dtype;                              /* target float dtype, or -1 to keep each tensor's */
    const struct quant_params *q;           /* NULL: no quantization */
    const char *const *drop;                /* NULL-terminated names to leave out, or NULL */
    ck_quant_predicate_fn predicate;        /* the family's, or NULL: every candidate */
    const struct ck_view_rule *views;       /* the family's, {NULL} terminated, or NULL */
};

/* Plan the output tensors for n inputs. *out (n_out entries) is owned by the caller
 * (ck_tensors_free). An incomplete expert set (some of 0..E-1 missing, or parts of
 * different shapes or dtypes) -> -ERR_FORMAT naming the tensor. */
int ck_plan(const struct ck_input *in, size_t n, const struct ck_plan_opts *o, struct ck_tensor **out,
            size_t *n_out, struct err *e);
void ck_tensors_free(struct ck_tensor *t, size_t n);

struct ck_stats {
    size_t n_tensors;     /* entries in the file */
    size_t n_quantized;   /* tensors quantized */
    int64_t n_params;     /* elements before quantization */
    uint64_t bytes;       /* data bytes written */
};

/* Most threads the quantizer uses (rows are independent; more gains nothing on a stream). */
#define CK_MAX_THREADS 64

struct tpool;
/* Write the planned tensors to path (st_write: temp file then rename), quantized with q
 * when they are marked (q may be NULL when none is). stats and progress may be NULL. pool
 * (borrowed, at most CK_MAX_THREADS threads) quantizes; NULL: a pool of the online CPUs
 * while there is something to quantize. The bytes do not depend on the threads. */
int ck_write(const char *path, const struct ck_tensor *t, size_t n, const struct quant_params *q,
             const struct ck_reader *rd, ck_progress_fn progress, void *progress_ud,
             struct tpool *pool, struct ck_stats *stats, struct err *e);

/* Add "quantization" and "quantization_config" = {"group_size", "bits", "mode"} to cfg (as
 * current mlx-lm writes them), replacing any present. */
int ck_config_set_quant(cJSON *cfg, const struct quant_params *q, struct err *e);
/* Write dir/config.json as mlx-lm's save_config does: the quantization objects of q when q is
 * not NULL (ck_config_set_quant), "_name_or_path" and "vision_config" dropped, keys sorted;
 * temp file then rename. cfg is modified. */
int ck_config_write(const char *dir, cJSON *cfg, const struct quant_params *q, struct err *e);
/* Copy a regular file of at most max bytes (temp file then rename), src opened as a folder
 * file (file_open's FILE_FOLDER rule); the copy's mode is at most the source's bits. */
int ck_copy_file(const char *src, const char *dst, uint64_t max, struct err *e);
/* ck_copy_file of src_dir/name into the staging folder od (registered with outdir_file). */
int ck_copy_into(struct outdir *od, const char *src_dir, const char *name, struct err *e);
/* A checkpoint folder to write: dst (absent or an empty folder), copy (may be NULL) puts the
 * small files into the staging folder first, then model.safetensors (ck_write with q, rd,
 * progress) and config.json (ck_config_write) follow. */
struct ck_folder {
    const char *dst;
    int (*copy)(void *ud, struct outdir *od, struct err *e);
    void *copy_ud;
    const struct quant_params *q;
    const struct ck_reader *rd;
    ck_progress_fn progress;
    void *progress_ud;
    struct tpool *pool;     /* ck_write's pool (borrowed), or NULL */
    bool keep_vision_config; /* the tensors hold the vision tower: config.json keeps vision_config */
};
/* Write the folder f->dst whole or not at all (outdir.h): built beside it and renamed into
 * place when complete; on any failure nothing is left. cfg is modified (ck_config_write). */
int ck_write_folder(const struct ck_folder *f, const struct ck_tensor *t, size_t n, cJSON *cfg,
                    struct ck_stats *stats, struct err *e);
/* "bf16"/"bfloat16", "f16"/"float16", "f32"/"float32" -> dtype; -1 otherwise. */
int ck_dtype_parse(const char *s);

struct convert_opts {
    const char *src, *dst;                  /* checkpoint folders */
    const struct expert_stack_rule *rules;  /* the family's, or NULL */
    const char *const *drop;                /* e.g. a tied "lm_head.weight"; NULL-terminated */
    int dtype;                              /* -1: the config's torch_dtype, else keep */
    const struct quant_params *q;           /* NULL: float output */
    ck_progress_fn progress;
    void *progress_ud;
    ck_quant_predicate_fn predicate;        /* the family's quant_predicate, or NULL */
    const struct ck_view_rule *views;       /* the family's convert_views, or NULL */
    /* --fuse-lora: the merged F32 values [out * in] of source tensor name (W + s B A, the
     * caller's, alive through the call), or NULL to read it as stored; NULL: none */
    const float *(*replace)(void *ud, const char *name);
    void *replace_ud;
};

struct convert_stats {
    struct ck_stats ck;
    size_t n_inputs;       /* source tensors */
    size_t n_copied;       /* metadata files copied */
    int dtype;             /* target dtype used, -1 when kept */
};

/* src -> dst: config.json (+ quantization), model.safetensors, and the allow-listed
 * metadata files (tokenizer files, generation_config.json, chat templates, README.md,
 * LICENSE*, ...) copied. Everything is built in a staging folder beside dst (outdir.h)
 * renamed onto dst when complete, so on any failure dst is left as it was. An already
 * quantized source -> -ERR_UNSUPPORTED. */
int convert_checkpoint(const struct convert_opts *o, struct convert_stats *st, struct err *e);

#ifdef __cplusplus
}
#endif

/*
 * hybrid_input suite: bad input for the recurrent and hybrid families (issue 41:
 * "configs with inconsistent state sizes, a checkpoint missing A_log or conv1d,
 * layer patterns that do not match the layer count: a clear error naming the
 * field"). One table of mutations of the golden fixtures
 * (tests/fixtures/golden/<family>; "q:<family>" is that config synthesized
 * with `synth -q`, mlx-lm's layout at 4 bits): a config.json key replaced, added or
 * removed, a tensor left out, cut short by one row, stored with its dims
 * reversed, or declared an integer type. Each must be refused by model_load (and by `mlxcel inspect`, one
 * error line, exit 1) with a message naming the field or the tensor: never a
 * crash, an assert, an out-of-bounds read (the suite runs under ASan) or a
 * model that loads. HYBRID_INPUT_TABLE=1 prints the table with the messages.
 *
 * extreme_fields: every state-size, pattern and count field of these families
 * set in turn to extreme values (0, -1, 2^30, 2^31 - 1, -2^31, 1048577, 1.5,
 * a string) in each family's golden config, through its parse_config and
 * hparams_validate: refused, or accepted with recurrent layers the engine can
 * run (a state of at most HP_MAX_STATE floats, Mamba-2's heads x head_dim =
 * inner width, groups dividing heads, a chunk of at least 1).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_run.h"
#include "core/dtype.h"
#include "core/safetensors.h"
#include "core/st_write.h"
#include "loading/config.h"
#include "loading/convert.h"
#include "models/model.h"
#include "models/registry.h"
#include "models/selftest.h"
#include "models/synth.h"
#include "st_build.h"
#include "test.h"

enum mut_op {
    MUT_CONFIG,   /* the patch only */
    MUT_DROP,     /* tensor left out */
    MUT_SHRINK,   /* tensor's first dim one shorter (its first bytes) */
    MUT_SWAP,     /* tensor's dims reversed (same bytes) */
    MUT_INT,      /* tensor's 16-bit floats declared I16 (same bytes) */
};

struct mut {
    const char *family;  /* golden fixture folder */
    const char *patch;   /* JSON object: keys replace config.json's; a value "$delete" removes the key */
    enum mut_op op;
    const char *tensor;  /* for MUT_DROP / SHRINK / SWAP */
    const char *want;    /* the error must contain this (the field or the tensor) */
};

#define CFG(fam, patch, want)   {fam, patch, MUT_CONFIG, NULL, want}
#define DROP(fam, t)            {fam, NULL, MUT_DROP, t, t}
#define SHRINK(fam, t)          {fam, NULL, MUT_SHRINK, t, t}
#define SWAP(fam, t)            {fam, NULL, MUT_SWAP, t, t}
#define INT(fam, t)             {fam, NULL, MUT_INT, t, t}

/* layer patterns of the fixtures, one entry short, and with an unknown kind */
#define LFM2_SHORT "[\"conv\", \"full_attention\", \"conv\"]"
#define LFM2_BAD   "[\"conv\", \"full_attention\", \"conv\", \"mamba\"]"
#define NEMO_SHORT "[\"linear_attention\", \"full_attention\", \"linear_attention\"]"
#define NEMO_BAD   "[\"linear_attention\", \"full_attention\", \"linear_attention\", \"conv\"]"
#define GMH_SHORT  "[\"linear_attention\", \"full_attention\", \"linear_attention\"]"
#define GMH_BAD    "[\"linear_attention\", \"full_attention\", \"linear_attention\", \"mlp\"]"
#define QN_SHORT   "[\"linear_attention\", \"linear_attention\", \"full_attention\"]"
#define QN_BAD     "[\"linear_attention\", \"linear_attention\", \"full_attention\", \"sliding_attention\"]"

static const struct mut k_muts[] = {
    /* ---- lfm2: layer_types [conv, attn, conv, attn], conv_L_cache 3 ---- */
    CFG("lfm2", "{\"layer_types\": " LFM2_SHORT "}", "layer_types"),
    CFG("lfm2", "{\"layer_types\": " LFM2_BAD "}", "layer_types"),
    CFG("lfm2", "{\"layer_types\": \"conv\"}", "layer_types"),
    CFG("lfm2", "{\"num_hidden_layers\": 5}", "layer_types"),
    CFG("lfm2", "{\"layer_types\": \"$delete\", \"full_attn_idxs\": [1, 4]}", "full_attn_idxs"),
    CFG("lfm2", "{\"layer_types\": \"$delete\", \"full_attn_idxs\": [-1]}", "full_attn_idxs"),
    CFG("lfm2", "{\"layer_types\": \"$delete\", \"full_attn_idxs\": [1.5]}", "full_attn_idxs"),
    CFG("lfm2", "{\"conv_L_cache\": 0}", "conv_L_cache"),
    CFG("lfm2", "{\"conv_L_cache\": 100000}", "conv_L_cache"),
    CFG("lfm2", "{\"conv_L_cache\": 4}", "model.layers.0.conv.conv.weight"),
    CFG("lfm2", "{\"conv_bias\": true}", "model.layers.0.conv.in_proj.bias"),
    DROP("lfm2", "model.layers.0.conv.conv.weight"),
    DROP("lfm2", "model.layers.2.conv.in_proj.weight"),
    DROP("lfm2", "model.layers.2.conv.out_proj.weight"),
    DROP("lfm2", "model.layers.0.operator_norm.weight"),
    DROP("lfm2", "model.layers.1.self_attn.q_layernorm.weight"),
    SHRINK("lfm2", "model.layers.0.conv.conv.weight"),
    SHRINK("lfm2", "model.layers.2.conv.in_proj.weight"),
    SWAP("lfm2", "model.layers.0.conv.conv.weight"),
    INT("lfm2", "model.layers.0.conv.conv.weight"),
    INT("lfm2", "model.layers.0.operator_norm.weight"),
    CFG("lfm2", "{\"layer_types\": [\"conv\", 1, \"conv\", \"full_attention\"]}", "'layer_types'[1] = '(not a string)'"),

    /* ---- mamba: 2 layers, d_inner 128, state 16, conv 4, dt_rank 4 ---- */
    CFG("mamba", "{\"state_size\": 0}", "state_size"),
    CFG("mamba", "{\"state_size\": 100000}", "state_size"),
    CFG("mamba", "{\"conv_kernel\": 0}", "conv_kernel"),
    CFG("mamba", "{\"conv_kernel\": 100000}", "conv_kernel"),
    CFG("mamba", "{\"intermediate_size\": 0}", "intermediate_size"),
    CFG("mamba", "{\"intermediate_size\": 96}", "intermediate_size"),
    CFG("mamba", "{\"time_step_rank\": 0}", "time_step_rank"),
    CFG("mamba", "{\"time_step_rank\": 100000000}", "time_step_rank"),
    CFG("mamba", "{\"num_hidden_layers\": 0}", "num_hidden_layers"),
    CFG("mamba", "{\"time_step_rank\": 5}", "backbone.layers.0.mixer.x_proj.weight"),
    CFG("mamba", "{\"num_hidden_layers\": 3}", "backbone.layers.2"),
    DROP("mamba", "backbone.layers.0.mixer.A_log"),
    DROP("mamba", "backbone.layers.1.mixer.D"),
    DROP("mamba", "backbone.layers.0.mixer.conv1d.weight"),
    DROP("mamba", "backbone.layers.0.mixer.conv1d.bias"),
    DROP("mamba", "backbone.layers.0.mixer.dt_proj.weight"),
    DROP("mamba", "backbone.layers.0.mixer.dt_proj.bias"),
    DROP("mamba", "backbone.layers.1.mixer.x_proj.weight"),
    DROP("mamba", "backbone.layers.1.mixer.in_proj.weight"),
    DROP("mamba", "backbone.layers.1.mixer.out_proj.weight"),
    DROP("mamba", "backbone.layers.0.norm.weight"),
    SHRINK("mamba", "backbone.layers.0.mixer.A_log"),
    SWAP("mamba", "backbone.layers.0.mixer.A_log"),
    SHRINK("mamba", "backbone.layers.1.mixer.D"),
    SHRINK("mamba", "backbone.layers.0.mixer.conv1d.weight"),
    SWAP("mamba", "backbone.layers.0.mixer.conv1d.weight"),
    SHRINK("mamba", "backbone.layers.0.mixer.x_proj.weight"),
    SWAP("mamba", "backbone.layers.0.mixer.dt_proj.weight"),
    INT("mamba", "backbone.layers.0.mixer.A_log"),
    INT("mamba", "backbone.layers.0.mixer.conv1d.weight"),
    INT("mamba", "backbone.layers.0.mixer.D"),
    INT("mamba", "backbone.layers.0.mixer.x_proj.weight"),
    CFG("mamba", "{\"expand\": 16384, \"intermediate_size\": \"$delete\", \"state_size\": 256}", "state_size"),

    /* ---- mamba2: 8 heads of 16 = 2 x 64, 1 group, state 16 ---- */
    CFG("mamba2", "{\"num_heads\": 7}", "num_heads"),
    CFG("mamba2", "{\"head_dim\": 32}", "head_dim"),
    CFG("mamba2", "{\"head_dim\": 0}", "head_dim"),
    CFG("mamba2", "{\"n_groups\": 3}", "n_groups"),
    CFG("mamba2", "{\"n_groups\": 16}", "n_groups"),
    CFG("mamba2", "{\"n_groups\": 0}", "n_groups"),
    CFG("mamba2", "{\"state_size\": 0}", "state_size"),
    CFG("mamba2", "{\"state_size\": 100000}", "state_size"),
    CFG("mamba2", "{\"conv_kernel\": 0}", "conv_kernel"),
    CFG("mamba2", "{\"conv_kernel\": 100000}", "conv_kernel"),
    CFG("mamba2", "{\"chunk_size\": 0}", "chunk_size"),
    CFG("mamba2", "{\"expand\": 4}", "num_heads"),
    CFG("mamba2", "{\"expand\": -1}", "expand"),
    CFG("mamba2", "{\"n_groups\": 2}", "backbone.layers.0.mixer.in_proj"),
    CFG("mamba2", "{\"state_size\": 32}", "backbone.layers.0.mixer.in_proj"),
    CFG("mamba2", "{\"layer_norm_epsilon\": 0}", "layer_norm_epsilon"),
    DROP("mamba2", "backbone.layers.1.mixer.A_log"),
    DROP("mamba2", "backbone.layers.0.mixer.D"),
    DROP("mamba2", "backbone.layers.0.mixer.dt_bias"),
    DROP("mamba2", "backbone.layers.0.mixer.conv1d.weight"),
    DROP("mamba2", "backbone.layers.0.mixer.conv1d.bias"),
    DROP("mamba2", "backbone.layers.0.mixer.norm.weight"),
    DROP("mamba2", "backbone.layers.0.mixer.in_proj.weight"),
    DROP("mamba2", "backbone.layers.1.mixer.out_proj.weight"),
    SHRINK("mamba2", "backbone.layers.0.mixer.dt_bias"),
    SHRINK("mamba2", "backbone.layers.0.mixer.A_log"),
    SHRINK("mamba2", "backbone.layers.0.mixer.conv1d.weight"),
    SWAP("mamba2", "backbone.layers.0.mixer.conv1d.weight"),
    SHRINK("mamba2", "backbone.layers.0.mixer.in_proj.weight"),
    SHRINK("mamba2", "backbone.layers.0.mixer.norm.weight"),
    INT("mamba2", "backbone.layers.0.mixer.A_log"),
    INT("mamba2", "backbone.layers.0.mixer.dt_bias"),
    INT("mamba2", "backbone.layers.0.mixer.D"),
    INT("mamba2", "backbone.layers.0.mixer.conv1d.weight"),
    INT("mamba2", "backbone.layers.0.mixer.conv1d.bias"),
    INT("mamba2", "backbone.layers.0.mixer.norm.weight"),
    INT("mamba2", "backbone.layers.0.mixer.in_proj.weight"),
    CFG("mamba2", "{\"expand\": 1024, \"num_heads\": 4096, \"head_dim\": 16, \"n_groups\": 4096, "
        "\"state_size\": 256}", "state_size"),

    /* ---- jamba: attention at 1, 3 (period 2, offset 1), experts likewise ---- */
    CFG("jamba", "{\"attn_layer_period\": 0}", "attn_layer_period"),
    CFG("jamba", "{\"attn_layer_offset\": 2}", "attn_layer_offset"),
    CFG("jamba", "{\"attn_layer_offset\": -1}", "attn_layer_offset"),
    CFG("jamba", "{\"expert_layer_period\": 0}", "expert_layer_period"),
    CFG("jamba", "{\"expert_layer_offset\": 3}", "expert_layer_offset"),
    CFG("jamba", "{\"mamba_d_state\": 0}", "mamba_d_state"),
    CFG("jamba", "{\"mamba_d_conv\": 0}", "mamba_d_conv"),
    CFG("jamba", "{\"mamba_dt_rank\": 0}", "mamba_dt_rank"),
    CFG("jamba", "{\"mamba_dt_rank\": 100000000}", "mamba_dt_rank"),
    CFG("jamba", "{\"num_hidden_layers\": 0}", "num_hidden_layers"),
    CFG("jamba", "{\"mamba_expand\": 0}", "mamba_expand"),
    CFG("jamba", "{\"num_experts_per_tok\": 5}", "num_experts_per_tok"),
    CFG("jamba", "{\"num_experts\": 0}", "num_experts"),
    CFG("jamba", "{\"layers_block_type\": [\"mamba\", \"attention\", \"mamba\"]}", "layers_block_type"),
    CFG("jamba", "{\"mamba_d_state\": 8}", "model.layers.0.mamba"),
    DROP("jamba", "model.layers.0.mamba.A_log"),
    DROP("jamba", "model.layers.2.mamba.D"),
    DROP("jamba", "model.layers.0.mamba.conv1d.weight"),
    DROP("jamba", "model.layers.0.mamba.conv1d.bias"),
    DROP("jamba", "model.layers.0.mamba.dt_layernorm.weight"),
    DROP("jamba", "model.layers.0.mamba.b_layernorm.weight"),
    DROP("jamba", "model.layers.0.mamba.x_proj.weight"),
    DROP("jamba", "model.layers.0.mamba.dt_proj.weight"),
    DROP("jamba", "model.layers.1.feed_forward.router.weight"),
    DROP("jamba", "model.layers.1.self_attn.k_proj.weight"),
    SHRINK("jamba", "model.layers.0.mamba.A_log"),
    SWAP("jamba", "model.layers.0.mamba.A_log"),
    SHRINK("jamba", "model.layers.0.mamba.dt_layernorm.weight"),
    SHRINK("jamba", "model.layers.1.feed_forward.router.weight"),
    SHRINK("jamba", "model.layers.0.mamba.conv1d.weight"),
    INT("jamba", "model.layers.0.mamba.dt_layernorm.weight"),
    INT("jamba", "model.layers.0.mamba.A_log"),
    CFG("jamba", "{\"layers_block_type\": [\"mamba\", \"attention\", \"mamba\", 7]}", "layers_block_type"),
    CFG("jamba", "{\"mamba_expand\": 16384, \"mamba_d_state\": 256}", "mamba_d_state"),

    /* ---- bamba: attention at [1, 3], Mamba-2 8 heads of 16 ---- */
    CFG("bamba", "{\"attn_layer_indices\": [1, 4]}", "attn_layer_indices"),
    CFG("bamba", "{\"attn_layer_indices\": [-1]}", "attn_layer_indices"),
    CFG("bamba", "{\"attn_layer_indices\": \"1\"}", "attn_layer_indices"),
    CFG("bamba", "{\"attn_layer_indices\": []}", "model.layers.1.mamba"),
    CFG("bamba", "{\"mamba_n_heads\": 7}", "mamba_n_heads"),
    CFG("bamba", "{\"mamba_d_head\": 32}", "mamba_d_head"),
    CFG("bamba", "{\"mamba_n_groups\": 3}", "mamba_n_groups"),
    CFG("bamba", "{\"mamba_d_state\": 0}", "mamba_d_state"),
    CFG("bamba", "{\"mamba_d_conv\": 0}", "mamba_d_conv"),
    CFG("bamba", "{\"mamba_chunk_size\": 0}", "mamba_chunk_size"),
    CFG("bamba", "{\"mamba_expand\": 3}", "mamba_n_heads"),
    DROP("bamba", "model.layers.0.mamba.A_log"),
    DROP("bamba", "model.layers.0.mamba.D"),
    DROP("bamba", "model.layers.2.mamba.dt_bias"),
    DROP("bamba", "model.layers.0.mamba.conv1d.weight"),
    DROP("bamba", "model.layers.0.mamba.norm.weight"),
    DROP("bamba", "model.layers.0.mamba.in_proj.weight"),
    DROP("bamba", "model.layers.1.self_attn.q_proj.weight"),
    SHRINK("bamba", "model.layers.0.mamba.dt_bias"),
    SHRINK("bamba", "model.layers.0.mamba.conv1d.weight"),
    SWAP("bamba", "model.layers.0.mamba.out_proj.weight"),
    CFG("bamba", "{\"attn_layer_indices\": [1, \"x\"]}", "attn_layer_indices"),

    /* ---- nemotron_h: layers_block_type [mamba, attention, mamba, mlp] ---- */
    CFG("nemotron_h", "{\"num_hidden_layers\": 4, \"layers_block_type\": " NEMO_SHORT "}",
        "layers_block_type"),
    CFG("nemotron_h", "{\"layers_block_type\": " NEMO_BAD "}", "layers_block_type"),
    CFG("nemotron_h", "{\"num_hidden_layers\": 5}", "layers_block_type"),
    CFG("nemotron_h", "{\"num_hidden_layers\": 4, \"layers_block_type\": \"$delete\", "
        "\"hybrid_override_pattern\": \"M*M\"}", "hybrid_override_pattern"),
    CFG("nemotron_h", "{\"layers_block_type\": \"$delete\", \"hybrid_override_pattern\": \"M*MX\"}",
        "hybrid_override_pattern"),
    CFG("nemotron_h", "{\"mamba_num_heads\": 7}", "mamba_num_heads"),
    CFG("nemotron_h", "{\"mamba_head_dim\": 32}", "mamba_head_dim"),
    CFG("nemotron_h", "{\"n_groups\": 3}", "n_groups"),
    CFG("nemotron_h", "{\"ssm_state_size\": 0}", "ssm_state_size"),
    CFG("nemotron_h", "{\"conv_kernel\": 0}", "conv_kernel"),
    CFG("nemotron_h", "{\"chunk_size\": 0}", "chunk_size"),
    CFG("nemotron_h", "{\"expand\": 3}", "mamba_num_heads"),
    DROP("nemotron_h", "backbone.layers.0.mixer.A_log"),
    DROP("nemotron_h", "backbone.layers.0.mixer.D"),
    DROP("nemotron_h", "backbone.layers.2.mixer.dt_bias"),
    DROP("nemotron_h", "backbone.layers.0.mixer.conv1d.weight"),
    DROP("nemotron_h", "backbone.layers.0.mixer.norm.weight"),
    DROP("nemotron_h", "backbone.layers.1.mixer.q_proj.weight"),
    DROP("nemotron_h", "backbone.layers.3.mixer.up_proj.weight"),
    SHRINK("nemotron_h", "backbone.layers.0.mixer.A_log"),
    SHRINK("nemotron_h", "backbone.layers.2.mixer.conv1d.weight"),
    INT("nemotron_h", "backbone.layers.0.mixer.A_log"),
    CFG("nemotron_h", "{\"layers_block_type\": \"$delete\", \"hybrid_override_pattern\": \"\"}",
        "hybrid_override_pattern"),
    CFG("nemotron_h", "{\"layers_block_type\": [\"linear_attention\", 1, \"linear_attention\", \"mlp\"]}",
        "layers_block_type"),

    /* ---- granitemoehybrid: layer_types [mamba, attention, mamba, attention], 4 experts ---- */
    CFG("granitemoehybrid", "{\"layer_types\": " GMH_SHORT "}", "layer_types"),
    CFG("granitemoehybrid", "{\"layer_types\": " GMH_BAD "}", "layer_types"),
    CFG("granitemoehybrid", "{\"layer_types\": [\"mamba\", \"attention\", null, \"attention\"]}",
        "'layer_types'[2] = '(not a string)'"),
    CFG("granitemoehybrid", "{\"num_hidden_layers\": 5}", "layer_types"),
    CFG("granitemoehybrid", "{\"mamba_n_heads\": 7}", "mamba_n_heads"),
    CFG("granitemoehybrid", "{\"mamba_n_groups\": 3}", "mamba_n_groups"),
    CFG("granitemoehybrid", "{\"mamba_d_state\": 0}", "mamba_d_state"),
    CFG("granitemoehybrid", "{\"mamba_d_conv\": 0}", "mamba_d_conv"),
    CFG("granitemoehybrid", "{\"num_experts_per_tok\": 5}", "num_experts_per_tok"),
    DROP("granitemoehybrid", "model.layers.0.mamba.A_log"),
    DROP("granitemoehybrid", "model.layers.0.mamba.conv1d.weight"),
    DROP("granitemoehybrid", "model.layers.2.mamba.D"),
    DROP("granitemoehybrid", "model.layers.0.mamba.dt_bias"),
    DROP("granitemoehybrid", "model.layers.0.mamba.norm.weight"),
    DROP("granitemoehybrid", "model.layers.0.block_sparse_moe.router.layer.weight"),
    DROP("granitemoehybrid", "model.layers.0.shared_mlp.input_linear.weight"),
    SHRINK("granitemoehybrid", "model.layers.0.block_sparse_moe.input_linear.weight"),
    SHRINK("granitemoehybrid", "model.layers.0.mamba.D"),
    INT("granitemoehybrid", "model.layers.0.mamba.D"),
    INT("granitemoehybrid", "model.layers.0.block_sparse_moe.input_linear.weight"),

    /* ---- falcon_h1: every layer Mamba-2 and attention in parallel ---- */
    CFG("falcon_h1", "{\"mamba_d_ssm\": 100}", "mamba_d_ssm"),
    CFG("falcon_h1", "{\"mamba_d_ssm\": 256, \"mamba_n_heads\": 16}", "model.layers.0.mamba"),
    CFG("falcon_h1", "{\"mamba_n_heads\": 7}", "mamba_n_heads"),
    CFG("falcon_h1", "{\"mamba_n_groups\": 3}", "mamba_n_groups"),
    CFG("falcon_h1", "{\"mamba_d_state\": 0}", "mamba_d_state"),
    CFG("falcon_h1", "{\"mamba_d_conv\": 0}", "mamba_d_conv"),
    CFG("falcon_h1", "{\"mamba_chunk_size\": 0}", "mamba_chunk_size"),
    CFG("falcon_h1", "{\"mlp_multipliers\": [1.0]}", "mlp_multipliers"),
    CFG("falcon_h1", "{\"ssm_multipliers\": [1.0, 1.0]}", "ssm_multipliers"),
    CFG("falcon_h1", "{\"ssm_multipliers\": \"x\"}", "ssm_multipliers"),
    DROP("falcon_h1", "model.layers.0.mamba.A_log"),
    DROP("falcon_h1", "model.layers.1.mamba.D"),
    DROP("falcon_h1", "model.layers.0.mamba.dt_bias"),
    DROP("falcon_h1", "model.layers.0.mamba.conv1d.weight"),
    DROP("falcon_h1", "model.layers.0.mamba.norm.weight"),
    DROP("falcon_h1", "model.layers.0.mamba.in_proj.weight"),
    DROP("falcon_h1", "model.layers.2.self_attn.q_proj.weight"),
    SHRINK("falcon_h1", "model.layers.0.mamba.A_log"),
    SHRINK("falcon_h1", "model.layers.0.mamba.conv1d.weight"),
    INT("falcon_h1", "model.layers.0.mamba.A_log"),
    CFG("falcon_h1", "{\"mamba_d_ssm\": 1048576, \"mamba_n_heads\": 4096, \"mamba_d_head\": 256, "
        "\"mamba_d_state\": 256}", "mamba_"),

    /* ---- qwen3_next: linear layers 0, 1, 3; 2 key heads, 4 value heads; 8 experts ---- */
    CFG("qwen3_next", "{\"layer_types\": " QN_SHORT "}", "layer_types"),
    CFG("qwen3_next", "{\"layer_types\": " QN_BAD "}", "layer_types"),
    CFG("qwen3_next", "{\"num_hidden_layers\": 5}", "layer_types"),
    CFG("qwen3_next", "{\"layer_types\": \"$delete\", \"full_attention_interval\": 0}",
        "full_attention_interval"),
    CFG("qwen3_next", "{\"linear_num_value_heads\": 3}", "linear_num_value_heads"),
    CFG("qwen3_next", "{\"linear_num_key_heads\": 0}", "linear_num_key_heads"),
    CFG("qwen3_next", "{\"linear_num_key_heads\": 3}", "linear_num_value_heads"),
    CFG("qwen3_next", "{\"linear_conv_kernel_dim\": 0}", "linear_conv_kernel_dim"),
    CFG("qwen3_next", "{\"linear_conv_kernel_dim\": 100000}", "linear_conv_kernel_dim"),
    CFG("qwen3_next", "{\"linear_key_head_dim\": 0}", "linear_key_head_dim"),
    CFG("qwen3_next", "{\"linear_value_head_dim\": 0}", "linear_value_head_dim"),
    CFG("qwen3_next", "{\"linear_key_head_dim\": 100000}", "linear_key_head_dim"),
    CFG("qwen3_next", "{\"linear_num_value_heads\": 100000}", "linear_num_value_heads"),
    CFG("qwen3_next", "{\"num_experts_per_tok\": 9}", "num_experts_per_tok"),
    CFG("qwen3_next", "{\"decoder_sparse_step\": 0}", "decoder_sparse_step"),
    CFG("qwen3_next", "{\"mlp_only_layers\": [7]}", "mlp_only_layers"),
    CFG("qwen3_next", "{\"mlp_only_layers\": [-1]}", "mlp_only_layers"),
    DROP("qwen3_next", "model.layers.0.linear_attn.A_log"),
    DROP("qwen3_next", "model.layers.0.linear_attn.conv1d.weight"),
    DROP("qwen3_next", "model.layers.1.linear_attn.dt_bias"),
    DROP("qwen3_next", "model.layers.0.linear_attn.in_proj_qkvz.weight"),
    DROP("qwen3_next", "model.layers.0.linear_attn.in_proj_ba.weight"),
    DROP("qwen3_next", "model.layers.0.linear_attn.norm.weight"),
    DROP("qwen3_next", "model.layers.3.linear_attn.out_proj.weight"),
    DROP("qwen3_next", "model.layers.0.mlp.gate.weight"),
    DROP("qwen3_next", "model.layers.0.mlp.shared_expert_gate.weight"),
    SHRINK("qwen3_next", "model.layers.0.linear_attn.in_proj_ba.weight"),
    SWAP("qwen3_next", "model.layers.0.linear_attn.in_proj_ba.weight"),
    SHRINK("qwen3_next", "model.layers.0.linear_attn.conv1d.weight"),
    SHRINK("qwen3_next", "model.layers.0.linear_attn.A_log"),
    SHRINK("qwen3_next", "model.layers.0.linear_attn.norm.weight"),
    INT("qwen3_next", "model.layers.0.linear_attn.A_log"),
    INT("qwen3_next", "model.layers.0.linear_attn.dt_bias"),
    INT("qwen3_next", "model.layers.0.linear_attn.conv1d.weight"),
    INT("qwen3_next", "model.layers.0.linear_attn.norm.weight"),
    CFG("qwen3_next", "{\"layer_types\": [\"linear_attention\", 2, \"full_attention\", \"linear_attention\"]}",
        "'layer_types'[1] = '(not a string)'"),
    CFG("qwen3_next", "{\"mlp_only_layers\": \"x\"}", "mlp_only_layers"),
    CFG("qwen3_next", "{\"linear_num_value_heads\": 4096, \"linear_num_key_heads\": 4096, "
        "\"linear_key_head_dim\": 4096, \"linear_value_head_dim\": 4096}", "linear_"),

    /* ---- qwen3_5_text: the same mixer, dense MLP, split projections ---- */
    CFG("qwen3_5_text", "{\"layer_types\": " QN_SHORT "}", "layer_types"),
    CFG("qwen3_5_text", "{\"layer_types\": " QN_BAD "}", "layer_types"),
    CFG("qwen3_5_text", "{\"linear_num_value_heads\": 3}", "linear_num_value_heads"),
    CFG("qwen3_5_text", "{\"linear_num_key_heads\": 0}", "linear_num_key_heads"),
    CFG("qwen3_5_text", "{\"linear_conv_kernel_dim\": 0}", "linear_conv_kernel_dim"),
    DROP("qwen3_5_text", "model.layers.0.linear_attn.A_log"),
    DROP("qwen3_5_text", "model.layers.0.linear_attn.conv1d.weight"),
    DROP("qwen3_5_text", "model.layers.0.linear_attn.dt_bias"),
    DROP("qwen3_5_text", "model.layers.0.linear_attn.in_proj_a.weight"),
    DROP("qwen3_5_text", "model.layers.0.linear_attn.in_proj_b.weight"),
    DROP("qwen3_5_text", "model.layers.1.linear_attn.in_proj_qkv.weight"),
    DROP("qwen3_5_text", "model.layers.1.linear_attn.in_proj_z.weight"),
    DROP("qwen3_5_text", "model.layers.0.linear_attn.norm.weight"),
    SHRINK("qwen3_5_text", "model.layers.0.linear_attn.in_proj_z.weight"),
    SHRINK("qwen3_5_text", "model.layers.0.linear_attn.in_proj_a.weight"),
    SHRINK("qwen3_5_text", "model.layers.0.linear_attn.dt_bias"),
    INT("qwen3_5_text", "model.layers.0.linear_attn.A_log"),
    INT("qwen3_5_text", "model.layers.0.linear_attn.in_proj_a.weight"),

    /* ---- recurrent_gemma: block_types [recurrent, recurrent, attention], lru_width 64 ---- */
    CFG("recurrent_gemma", "{\"block_types\": []}", "block_types"),
    CFG("recurrent_gemma", "{\"block_types\": [\"recurrent\", \"mamba\"]}", "block_types"),
    CFG("recurrent_gemma", "{\"block_types\": \"recurrent\"}", "block_types"),
    CFG("recurrent_gemma", "{\"lru_width\": 0}", "lru_width"),
    CFG("recurrent_gemma", "{\"num_hidden_layers\": 0}", "num_hidden_layers"),
    CFG("recurrent_gemma", "{\"num_hidden_layers\": 4}", "model.layers.3"),
    CFG("recurrent_gemma", "{\"lru_width\": 62}", "lru_width"),
    CFG("recurrent_gemma", "{\"lru_width\": 60}", "model.layers.0.temporal_block.linear_y.weight"),
    CFG("recurrent_gemma", "{\"conv1d_width\": 0}", "conv1d_width"),
    CFG("recurrent_gemma", "{\"conv1d_width\": 100000}", "conv1d_width"),
    CFG("recurrent_gemma", "{\"attention_window_size\": 0}", "attention_window_size"),
    CFG("recurrent_gemma", "{\"block_types\": [\"attention\", \"recurrent\", \"recurrent\"]}",
        "model.layers.0.temporal_block"),
    DROP("recurrent_gemma", "model.layers.0.temporal_block.rg_lru.recurrent_param"),
    DROP("recurrent_gemma", "model.layers.0.temporal_block.conv_1d.weight"),
    DROP("recurrent_gemma", "model.layers.1.temporal_block.conv_1d.bias"),
    DROP("recurrent_gemma", "model.layers.0.temporal_block.rg_lru.input_gate_weight"),
    DROP("recurrent_gemma", "model.layers.0.temporal_block.rg_lru.recurrent_gate_bias"),
    DROP("recurrent_gemma", "model.layers.0.temporal_block.linear_x.weight"),
    DROP("recurrent_gemma", "model.layers.2.temporal_block.k_proj.weight"),
    SHRINK("recurrent_gemma", "model.layers.0.temporal_block.rg_lru.recurrent_param"),
    SHRINK("recurrent_gemma", "model.layers.0.temporal_block.rg_lru.input_gate_weight"),
    SWAP("recurrent_gemma", "model.layers.0.temporal_block.rg_lru.input_gate_bias"),
    SHRINK("recurrent_gemma", "model.layers.0.temporal_block.conv_1d.weight"),
    INT("recurrent_gemma", "model.layers.0.temporal_block.rg_lru.recurrent_param"),
    INT("recurrent_gemma", "model.layers.0.temporal_block.conv_1d.weight"),
    INT("recurrent_gemma", "model.layers.0.temporal_block.rg_lru.input_gate_weight"),
    CFG("recurrent_gemma", "{\"block_types\": [1]}", "'block_types'[0] = '(not a string)'"),
    CFG("recurrent_gemma", "{\"lru_width\": 1048576, \"conv1d_width\": 64}",
        "model.layers.0.temporal_block.linear_y.weight"),
};

/* ---- mlx-lm's quantized layouts (q:<family>, from synth -q of the golden config) ---- */
static const struct mut k_qmuts[] = {
    DROP("q:mamba2", "backbone.layers.0.mixer.in_proj.scales"),
    DROP("q:mamba2", "backbone.layers.0.mixer.in_proj.biases"),
    SWAP("q:mamba2", "backbone.layers.0.mixer.in_proj.scales"),
    SHRINK("q:mamba2", "backbone.layers.0.mixer.in_proj.weight"),
    SWAP("q:mamba2", "backbone.layers.0.mixer.out_proj.weight"),
    SHRINK("q:mamba2", "backbone.layers.0.mixer.conv1d.weight"),
    SWAP("q:mamba2", "backbone.layers.0.mixer.conv1d.weight"),
    DROP("q:mamba2", "backbone.layers.1.mixer.A_log"),
    DROP("q:mamba", "backbone.layers.0.mixer.x_proj.scales"),
    SHRINK("q:mamba", "backbone.layers.0.mixer.x_proj.weight"),
    SWAP("q:mamba", "backbone.layers.0.mixer.conv1d.weight"),
    DROP("q:jamba", "model.layers.1.feed_forward.switch_mlp.up_proj.scales"),
    SHRINK("q:jamba", "model.layers.1.feed_forward.switch_mlp.gate_proj.weight"),
    DROP("q:lfm2", "model.layers.0.conv.in_proj.scales"),
    SWAP("q:lfm2", "model.layers.0.conv.conv.weight"),
    DROP("q:qwen3_next", "model.layers.0.linear_attn.in_proj_ba.scales"),
    SHRINK("q:qwen3_next", "model.layers.0.linear_attn.in_proj_qkvz.weight"),
    SHRINK("q:qwen3_next", "model.layers.0.mlp.switch_mlp.gate_proj.scales"),
    DROP("q:qwen3_next", "model.layers.0.mlp.switch_mlp.up_proj.biases"),
    DROP("q:granitemoehybrid", "model.layers.0.mamba.in_proj.scales"),
    DROP("q:recurrent_gemma", "model.layers.0.temporal_block.linear_x.scales"),
    SWAP("q:recurrent_gemma", "model.layers.0.temporal_block.conv_1d.weight"),
};

/* The folder a case starts from: the golden fixture, or for "q:<family>" its config through
 * `synth -q` (4-bit affine, group 64, seed 1), made once per family into a folder under
 * *cache (removed by the caller). */
static const char *source_dir(const char *family, char **cache, char *buf, size_t cap)
{
    if (strncmp(family, "q:", 2) != 0) {
        snprintf(buf, cap, "%s/%s", test_path("tests/fixtures/golden"), family);
        return buf;
    }
    if (!*cache)
        *cache = stb_tmpdir();
    assert_non_null(*cache);
    snprintf(buf, cap, "%s/%s", *cache, family + 2);
    if (access(buf, F_OK) == 0)
        return buf;
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/%s/config.json", test_path("tests/fixtures/golden"), family + 2);
    struct quant_params q = {QMODE_AFFINE, 4, 64, 0};
    struct synth_opts o = {.config = cfg, .dst = buf, .q = &q, .dtype = -1, .seed = 1, .n_threads = 1};
    struct synth_stats st;
    struct err e = {0};
    if (synth_checkpoint(&o, &st, &e) < 0)
        fail_msg("synth -q %s: %s", family + 2, e.msg);
    return buf;
}

/* ---- building a mutated copy ---- */

/* The fixture's tensors into dst/model.safetensors, mutation m applied. */
static int write_tensors(const char *src, const char *dst, const struct mut *m, struct err *e)
{
    char path[4200];
    struct st_set *s = NULL;
    struct st_writer *w = NULL;
    struct st_wentry *ents = NULL;
    size_t n, k = 0;
    bool found = m->op == MUT_CONFIG;
    int rc;
    if ((rc = st_set_open(&s, src, e)) < 0)
        return rc;
    n = st_set_count(s);
    if (!(ents = calloc(n ? n : 1, sizeof *ents))) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = st_set_at(s, i);
        struct st_wentry *x = &ents[k];
        bool hit = m->tensor && strcmp(t->name, m->tensor) == 0;
        found |= hit;
        if (hit && m->op == MUT_DROP)
            continue;
        *x = (struct st_wentry){t->name, t->dtype, t->ndim, {0}};
        memcpy(x->shape, t->shape, sizeof t->shape);
        if (hit && m->op == MUT_SHRINK)
            x->shape[0]--;
        for (int d = 0; hit && m->op == MUT_SWAP && d < t->ndim; d++)
            x->shape[d] = t->shape[t->ndim - 1 - d];
        if (hit && m->op == MUT_INT) {
            if (dtype_size(t->dtype) != 2) {
                rc = err_setf(e, ERR_ARG, "'%s' is not a 16-bit tensor", t->name);
                goto out;
            }
            x->dtype = DTYPE_I16;
        }
        k++;
    }
    if (!found) {
        rc = err_setf(e, ERR_ARG, "%s has no tensor '%s'", src, m->tensor);
        goto out;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    if ((rc = st_writer_open(&w, path, ents, k, e)) < 0)
        goto out;
    for (size_t i = 0, j = 0; i < n && rc == 0; i++) {
        const struct st_tensor *t = st_set_at(s, i);
        if (m->tensor && strcmp(t->name, m->tensor) == 0 && m->op == MUT_DROP)
            continue;
        rc = st_writer_write(w, t->data, (size_t)st_wentry_bytes(&ents[j++]), e);
    }
    rc = rc == 0 ? st_writer_close(w, e) : (st_writer_abort(w), rc);
out:
    free(ents);
    st_set_free(s);
    return rc;
}

static const char *op_name(enum mut_op op)
{
    return op == MUT_DROP ? "drop" : op == MUT_SHRINK ? "shrink dim 0" : op == MUT_SWAP ? "reverse dims"
           : op == MUT_INT ? "declare I16" : "config";
}

/* ---- the table ---- */

/* Run n cases; a case that loads, or fails without naming its field or tensor, is
 * reported and counted, and the test fails at the end naming how many. */
static void run_table(const struct mut *cases, size_t n)
{
    bool table = getenv("HYBRID_INPUT_TABLE") != NULL;
    char *cache = NULL;
    int failures = 0;
    for (size_t i = 0; i < n; i++) {
        const struct mut *m = &cases[i];
        char buf[700], args[700];
        struct err e = {0};
        struct model *md = NULL;
        const char *src = source_dir(m->family, &cache, buf, sizeof buf);
        char *dir = stb_tmpdir();
        assert_non_null(dir);
        if (stest_write_config(src, dir, m->patch, &e) < 0 || write_tensors(src, dir, m, &e) < 0)
            fail_msg("%s: cannot build the mutation: %s", m->family, e.msg);
        int rc = model_load(&md, dir, &e);
        const char *what = m->op == MUT_CONFIG ? m->patch : m->tensor;
        if (table)
            printf("| %s | %s %s | %s |\n", m->family, op_name(m->op), what, rc == 0 ? "(loaded)" : e.msg);
        if (rc == 0 || md || !strstr(e.msg, m->want)) {
            fprintf(stderr, "  %s, %s %s: %s (want an error naming '%s')\n", m->family, op_name(m->op),
                    what, rc == 0 ? "loaded" : e.msg, m->want);
            failures++;
        } else {
            snprintf(args, sizeof args, "inspect -m %s", dir);
            cli_expect_error(args, m->want);
        }
        model_free(md);
        stb_rmtree(dir);
    }
    if (cache) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
        assert_int_equal(system(cmd), 0);
        free(cache);
    }
    if (failures)
        fail_msg("%d of %zu mutations were not refused naming their field or tensor", failures, n);
}

static void mutations(void **state)
{
    (void)state;
    run_table(k_muts, sizeof k_muts / sizeof k_muts[0]);
}

static void quantized_mutations(void **state)
{
    (void)state;
    run_table(k_qmuts, sizeof k_qmuts / sizeof k_qmuts[0]);
}

/* ---- extreme values ---- */

static const char *const k_families[] = {
    "lfm2", "mamba", "mamba2", "jamba", "bamba", "nemotron_h", "granitemoehybrid", "falcon_h1",
    "qwen3_next", "qwen3_5_text", "recurrent_gemma",
};

static const char *const k_fields[] = {
    "num_hidden_layers", "hidden_size", "state_size", "conv_kernel", "expand", "intermediate_size",
    "time_step_rank", "num_heads", "head_dim", "n_groups", "n_group", "chunk_size", "mamba_d_state",
    "mamba_d_conv", "mamba_expand", "mamba_dt_rank", "mamba_n_heads", "mamba_d_head",
    "mamba_n_groups", "mamba_chunk_size", "mamba_d_ssm", "mamba_num_heads", "mamba_head_dim",
    "ssm_state_size", "conv_L_cache", "linear_conv_kernel_dim", "linear_key_head_dim",
    "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads", "lru_width",
    "conv1d_width", "attention_window_size", "attn_layer_period", "attn_layer_offset",
    "expert_layer_period", "expert_layer_offset", "full_attention_interval", "decoder_sparse_step",
    "num_experts", "num_local_experts", "num_experts_per_tok", "attn_layer_indices",
    "full_attn_idxs", "mlp_only_layers", "shared_intermediate_size", "moe_intermediate_size",
    "num_attention_heads", "num_key_value_heads", "partial_rotary_factor",
};

/* What the engine assumes of an accepted config's recurrent layers; NULL when it holds. */
static const char *recurrent_invariant(const struct hparams *hp)
{
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        if (ls->kv == KV_RECURRENT &&
            (ls->state_conv < 0 || ls->state_rec < 0 || ls->state_conv + ls->state_rec <= 0 ||
             ls->state_conv > HP_MAX_STATE || ls->state_rec > HP_MAX_STATE))
            return "a recurrent layer's state is empty, negative or above HP_MAX_STATE";
        if (ls->mixer == MIXER_MAMBA2 &&
            (hp->ssm.chunk < 1 || hp->ssm.d_state < 1 || hp->ssm.d_conv < 1 || hp->ssm.n_group < 1 ||
             hp->ssm.n_head % hp->ssm.n_group != 0 ||
             (int64_t)hp->ssm.n_head * hp->ssm.head_dim != hp->ssm.d_inner))
            return "Mamba-2's chunk, state, conv, groups or heads x head_dim";
    }
    if (hp->rec_scratch < 0 || hp->rec_scratch > HP_MAX_STATE)
        return "rec_scratch";
    return NULL;
}

static void extreme_fields(void **state)
{
    (void)state;
    static const char *const values[] = {"0", "-1", "1073741824", "2147483647", "-2147483648",
                                         "1048577", "1.5", "\"x\"", "[]"};
    int accepted = 0, refused = 0;
    for (size_t f = 0; f < sizeof k_families / sizeof k_families[0]; f++) {
        char path[600];
        cJSON *base = NULL;
        const struct model_ops *ops = NULL;
        struct err e = {0};
        snprintf(path, sizeof path, "%s/%s/config.json", test_path("tests/fixtures/golden"), k_families[f]);
        assert_int_equal(cfg_load_file(path, FILE_FOLDER, &base, &e), 0);
        assert_int_equal(registry_resolve(base, &ops, &e), 0);
        for (size_t k = 0; k < sizeof k_fields / sizeof k_fields[0]; k++) {
            for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
                cJSON *cfg = cJSON_Duplicate(base, true), *val = cJSON_Parse(values[v]);
                assert_non_null(cfg);
                assert_non_null(val);
                cJSON_DeleteItemFromObjectCaseSensitive(cfg, k_fields[k]);
                assert_true(cJSON_AddItemToObject(cfg, k_fields[k], val));
                struct hparams hp;
                hparams_init(&hp);
                if (ops->parse_config(&hp, cfg, &e) == 0 && hparams_validate(&hp, &e) == 0) {
                    const char *bad = recurrent_invariant(&hp);
                    if (bad)
                        fail_msg("%s with %s = %s: accepted, but %s", k_families[f], k_fields[k],
                                 values[v], bad);
                    accepted++;
                } else {
                    assert_true(e.msg[0] != '\0');
                    refused++;
                }
                cJSON_Delete(cfg);
            }
        }
        cJSON_Delete(base);
    }
    assert_true(accepted > 0 && refused > 0);
}

static const struct CMUnitTest k_tests[] = {
    cmocka_unit_test(mutations),
    cmocka_unit_test(quantized_mutations),
    cmocka_unit_test(extreme_fields),
};

TEST_SUITE(hybrid_input, k_tests);

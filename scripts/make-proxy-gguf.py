#!/usr/bin/env python3
"""Write a synthetic (random-weight) F16 GGUF shaped like phixtral-4x2_8 for llama.cpp benchmarks.

llama.cpp has no Phi-2 + MoE ("phixtral") architecture, so two proxies are offered:

  --variant phi2dense : arch "phi2" (LayerNorm w/ bias, fused QKV w/ bias, partial NEOX rotary 32/80,
                        parallel attn+FFN residual, gelu MLP w/ biases, untied lm_head w/ bias) with
                        n_ff = 2 * 10240 = 20480, i.e. both active experts' fc1/fc2 fused into one dense MLP.
                        Per decode token it reads exactly the weight bytes phixtral top-2 reads (minus the
                        2560x4 router) and does the same matmul FLOPs.
  --variant llamamoe  : arch "llama" with 4 experts, top-2 (mixtral-style routing, mul_mat_id kernels),
                        SwiGLU experts (3 matrices) with n_ff_exp = 6816 (~ 2*10240/3, multiple of 32 and 96),
                        so active expert bytes/token and total expert bytes both match phixtral within 0.2%.
                        Differs in norm (RMSNorm), no biases, sequential residual, full rotary (80 dims:
                        llama.cpp's llama arch requires rope dims == head_dim).

Weights ~ N(0, 0.02), norms = 1, biases = 0. Tokenizer: minimal gpt2-BPE vocab of n_vocab dummy tokens
(first 256 = byte-level alphabet so "\n" tokenizes), one merge. llama-bench feeds random token ids.

--n-layer keeps fewer layers (scripts/bench-vs-llamacpp.sh uses 8, as make-bench-models.sh).
Needs numpy and llama.cpp's gguf-py on PYTHONPATH (LLAMA_SRC/gguf-py, the copy inside the llama.cpp source).
"""
import argparse
import sys

import numpy as np
import gguf

N_EMBD, N_LAYER, N_HEAD, HEAD_DIM, N_ROT, N_VOCAB, CTX = 2560, 32, 32, 80, 32, 51200, 2048
EXP_FF, N_EXPERT, N_EXPERT_USED = 10240, 4, 2
LLAMA_MOE_FF = 6816


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=["phi2dense", "llamamoe"], required=True)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-layer", type=int, default=N_LAYER, help="layers (default 32, the real model's)")
    ap.add_argument("--ctx", type=int, default=CTX, help="context length in the metadata (default 2048)")
    a = ap.parse_args()
    n_layer = a.n_layer

    rng = np.random.default_rng(a.seed)
    arch = "phi2" if a.variant == "phi2dense" else "llama"
    w = gguf.GGUFWriter(a.out, arch)
    w.add_name(f"synthetic-phixtral-4x2_8-{a.variant}")
    w.add_context_length(a.ctx)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(n_layer)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    # llama arch asserts n_rot == head_dim: the llama proxy rotates all 80 dims (negligible cost)
    w.add_rope_dimension_count(N_ROT if a.variant == "phi2dense" else HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if a.variant == "phi2dense":
        w.add_feed_forward_length(N_EXPERT_USED * EXP_FF)
        w.add_layer_norm_eps(1e-5)
    else:
        w.add_feed_forward_length(LLAMA_MOE_FF)
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(N_EXPERT_USED)
        w.add_layer_norm_rms_eps(1e-5)

    # minimal gpt2 BPE tokenizer
    toks = bytes_to_unicode() + ["\u0120t"]
    eot = 50256
    while len(toks) < N_VOCAB:
        toks.append("<|endoftext|>" if len(toks) == eot else f"<dummy{len(toks)}>")
    ttype = [gguf.TokenType.NORMAL] * N_VOCAB
    ttype[eot] = gguf.TokenType.CONTROL
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types(ttype)
    w.add_token_merges(["\u0120 t"])
    w.add_bos_token_id(eot)
    w.add_eos_token_id(eot)
    w.add_add_bos_token(False)

    # tensor list: (name, numpy shape (rows, cols) = ggml (ne1, ne0) reversed, kind)
    T = []
    T.append(("token_embd.weight", (N_VOCAB, N_EMBD), "w"))
    for i in range(n_layer):
        p = f"blk.{i}."
        if a.variant == "phi2dense":
            ff = N_EXPERT_USED * EXP_FF
            T += [(p + "attn_norm.weight", (N_EMBD,), "one"), (p + "attn_norm.bias", (N_EMBD,), "zero"),
                  (p + "attn_qkv.weight", (3 * N_EMBD, N_EMBD), "w"), (p + "attn_qkv.bias", (3 * N_EMBD,), "zero"),
                  (p + "attn_output.weight", (N_EMBD, N_EMBD), "w"), (p + "attn_output.bias", (N_EMBD,), "zero"),
                  (p + "ffn_up.weight", (ff, N_EMBD), "w"), (p + "ffn_up.bias", (ff,), "zero"),
                  (p + "ffn_down.weight", (N_EMBD, ff), "w"), (p + "ffn_down.bias", (N_EMBD,), "zero")]
        else:
            ff = LLAMA_MOE_FF
            T += [(p + "attn_norm.weight", (N_EMBD,), "one"),
                  (p + "attn_q.weight", (N_EMBD, N_EMBD), "w"), (p + "attn_k.weight", (N_EMBD, N_EMBD), "w"),
                  (p + "attn_v.weight", (N_EMBD, N_EMBD), "w"), (p + "attn_output.weight", (N_EMBD, N_EMBD), "w"),
                  (p + "ffn_norm.weight", (N_EMBD,), "one"),
                  (p + "ffn_gate_inp.weight", (N_EXPERT, N_EMBD), "w32"),
                  (p + "ffn_gate_exps.weight", (N_EXPERT, ff, N_EMBD), "w"),
                  (p + "ffn_up_exps.weight", (N_EXPERT, ff, N_EMBD), "w"),
                  (p + "ffn_down_exps.weight", (N_EXPERT, N_EMBD, ff), "w")]
    T.append(("output_norm.weight", (N_EMBD,), "one"))
    if a.variant == "phi2dense":
        T.append(("output_norm.bias", (N_EMBD,), "zero"))
    T.append(("output.weight", (N_VOCAB, N_EMBD), "w"))
    if a.variant == "phi2dense":
        T.append(("output.bias", (N_VOCAB,), "zero"))

    def dt(kind):
        return np.float16 if kind == "w" else np.float32

    for name, shape, kind in T:
        n = int(np.prod(shape))
        w.add_tensor_info(name, shape, np.dtype(dt(kind)), n * np.dtype(dt(kind)).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = 0
    for name, shape, kind in T:
        if kind == "one":
            arr = np.ones(shape, np.float32)
        elif kind == "zero":
            arr = np.zeros(shape, np.float32)
        else:
            arr = rng.standard_normal(shape, dtype=np.float32)
            arr *= 0.02
            if kind == "w":
                arr = arr.astype(np.float16)
        total += arr.size
        w.write_tensor_data(arr)
    w.close()
    print(f"wrote {a.out}: {len(T)} tensors, {total/1e9:.3f} B params", file=sys.stderr)


if __name__ == "__main__":
    main()

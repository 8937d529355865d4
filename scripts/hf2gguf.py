#!/usr/bin/env python3
"""hf2gguf.py [--outtype f16|f32|q4_0] [--threads N] [--mmproj MMPROJ.gguf] SRC OUT.gguf: a GGUF of a float
Hugging Face / MLX checkpoint folder, for llama.cpp (options before or after SRC OUT; --help).

The GGUF twin of a `mlxcel synth` model (scripts/bench-vs-llamacpp.sh): the same tensor values, so
llama.cpp and mlxcel run the same weights. Families: `llama` (arch llama; q/k rows permuted as
llama.cpp's convert_hf_to_gguf.py does), `phi` (arch phi2; partial NEOX rotary, no permutation),
`qwen3_moe` (arch qwen3moe; NEOX rotary, no permutation; the per-expert gate/up/down matrices
stacked into ffn_{gate,up,down}_exps [experts, out, in]) and `gpt_oss` (arch gpt-oss; NEOX rotary,
no permutation; the fused `gate_up_proj` [experts, hidden, 2*inter] split into gate (even columns)
and up (odd columns) and transposed, `down_proj` [experts, inter, hidden] transposed, their biases
split alike; attention sinks, router bias, q/k/v/o biases, sliding window and yarn rope scaling
carried over (yarn's factor as transformers takes it: max_position_embeddings / the original
context when that is stated); llama.cpp's gpt-oss makes even layers sliding, as the published
layer_types do), `bert` (arch bert, as llama.cpp's conversion/bert.py writes it: bidirectional,
the pooling of the folder's sentence-transformers 1_Pooling, the WordPiece vocabulary in phantom-space
form: `##x` -> `x`, any other non-special token `x` -> U+2581 `x`; [CLS] as BOS, [SEP] as SEP;
pooler and MLM heads dropped), `qwen3` (arch qwen3; NEOX rotary, no permutation; a
sentence-transformers folder with last-token pooling, Qwen3-Embedding, gets pooling LAST and
add_eos_token, as llama.cpp's GGUFs of Qwen3-Embedding have), two hybrids, as llama.cpp's
conversion/granite.py, mamba.py and qwen.py write them:
- `granitemoehybrid` (arch granitehybrid, Granite 4.0-H): per-layer head_count_kv, 0 marking a
  Mamba-2 layer (layer_types); the Mamba-2 mixer as ssm_* (A = -exp(A_log) and D as [heads, 1],
  conv1d [C, 1, K] -> [C, K], dt_bias as ssm_dt.bias, the gated norm as [groups, inner / groups],
  ssm_time_step_rank = mamba_n_heads); attention q/k rows permuted as llama's; input_linear
  [E, 2I, H] split into ffn_gate_exps (first I rows) and ffn_up_exps, the shared MLP's
  [2S, H] likewise into ffn_{gate,up}_shexp (plain ffn_{gate,up,down} when num_local_experts
  is 0); the four Granite multipliers; rope on (rope_scaling.finetuned) only for
  position_embedding_type "rope" (or none), NoPE otherwise. Refused: mamba_n_groups > 1
  (llama.cpp normalizes the gated output per group, transformers and mlxcel over the whole row).
- `qwen3_next` (arch qwen3next): recurrent_layers from layer_types (else every
  full_attention_interval-th layer is attention); the zero-centred RMSNorm weights w written
  as 1 + w (all but the linear attention's gated norm); in_proj_qkvz's per-key-head
  [q k v z] groups regrouped into attn_qkv ([q | k | v]) and attn_gate (z); in_proj_ba as
  ssm_ba; A = -exp(A_log); conv1d squeezed; experts stacked; the shared expert's sigmoid gate
  as ffn_gate_inp_shexp. MTP layers are not written.
and two image-text families (issue 43's benchmark against llama-mtmd-cli), as llama.cpp's converter
(conversion/gemma.py, conversion/qwenvl.py) writes them: the language model into OUT.gguf and,
with `--mmproj MMPROJ.gguf`, the vision tower and projector into a clip GGUF beside it:
- `gemma3` (Gemma3ForConditionalGeneration): arch gemma3, every RMSNorm weight + 1 (Gemma's
  `x * (1 + w)` as llama.cpp stores it), the sliding layers from layer_types as the
  sliding_window_pattern array, local and global rope bases, the global layers' linear rope
  factor; the mmproj is projector type gemma3: SigLIP's patch conv and position table F32 (the
  converter forces `.embeddings.` to F32), the rest of the tower F16, mm.input_projection as
  stored ([vision width, text width]: clip transposes it), mm.soft_emb_norm + 1, the projector
  scale factor (pooling side) written when it is not 4.
- `qwen2_5_vl`: arch qwen2vl with the M-RoPE sections (padded to 4); the mmproj is projector type
  qwen2.5vl_merger: the temporal patch conv [out, C, 2, p, p] split into two 2-D kernels
  (v.patch_embd.weight and v.patch_embd.weight.1, as llama.cpp reads it), each block's fused qkv
  split into q, k and v, the window-attention pattern from fullatt_block_indexes (evenly spaced,
  as llama.cpp requires), SiLU, the text's rms_norm_eps. llama.cpp's clip uses a 112-pixel
  attention window for Qwen2.5-VL whatever the config says, so a window_size other than 112 is
  refused.
  Tensor names of transformers 4 (`language_model.model.`) and 5 (`model.language_model.`,
  `model.vision_tower.`, `model.visual.`) both convert. --mmproj for any other family is an error.
Without torch or transformers: numpy plus the gguf-py that ships inside the llama.cpp source
(PYTHONPATH=LLAMA_SRC/gguf-py), so it writes what that llama.cpp reads.

--outtype (of OUT.gguf; the mmproj is always F16/F32 as the converter writes it):
- f16 (default): matrices (expert stacks included) F16, vectors (norms, biases, sinks) and BERT's
  position and token-type tables F32 (as llama.cpp's converter does; for the hybrids also norms,
  routers and conv kernels, by its rule).
- f32: every tensor F32: a twin without F16 rounding, to validate a writer.
- q4_0: the tensors `llama-quantize --pure Q4_0` quantizes of the f16 file (its F16 matrices but
  the MoE routers) as Q4_0, the rest as in f16: the values rounded to F16, then gguf-py's port of
  ggml's reference Q4_0 (quantize_row_q4_0_ref), a few thousand rows at a time, so the tensors
  are byte for byte what llama-quantize --pure Q4_0 writes of the F16 file (checked on
  llama-tiny, both hybrids and both small image-text shapes) without the F16 file on disk (a 7B
  twin needs no 15 GB intermediate), `--threads N` of them at a time (numpy lets go of the GIL
  inside each operation; the bytes do not change); general.file_type and
  general.quantization_version as llama-quantize sets them. Rows that are not whole 32-value blocks are an error.
Tensors are written one at a time (memory stays at one tensor: one expert stack for the MoE
families). The tokenizer is the folder's tokenizer.json (BPE, ByteLevel), padded to vocab_size
with `[PAD<id>]` tokens, pre-tokenizer gpt-2; llama-bench feeds token ids, so only its shape
matters.
"""
import argparse
import concurrent.futures
import json
import os
import struct
import sys

import numpy as np
import gguf


def read_index(src):
    """{tensor name: (file, header entry, data base offset)} over every shard."""
    files = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    if not files:
        sys.exit(f"hf2gguf: no *.safetensors in {src}")
    out = {}
    for fn in files:
        path = os.path.join(src, fn)
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr = json.loads(f.read(n))
        hdr.pop("__metadata__", None)
        for name, h in hdr.items():
            out[name] = (path, h, 8 + n)
    return out


_maps = {}


def load(index, name):
    """One tensor as float32."""
    path, h, base = index[name]
    if path not in _maps:
        _maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
    a, b = h["data_offsets"]
    raw = np.asarray(_maps[path][base + a: base + b])
    if h["dtype"] == "BF16":
        x = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif h["dtype"] == "F16":
        x = raw.view(np.float16).astype(np.float32)
    elif h["dtype"] == "F32":
        x = raw.view(np.float32).copy()
    else:
        sys.exit(f"hf2gguf: {name} is {h['dtype']}; only float checkpoints convert (quantize with llama-quantize)")
    return x.reshape(h["shape"])


def permute(w, nh):
    return w.reshape(nh, 2, w.shape[0] // nh // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def add_tokenizer(w, src, cfg, nv):
    with open(os.path.join(src, "tokenizer.json")) as f:
        tok = json.load(f)
    toks = [None] * nv
    for t, i in tok["model"]["vocab"].items():
        if i < nv:
            toks[i] = t
    ttype = [gguf.TokenType.NORMAL] * nv
    for at in tok.get("added_tokens", []):
        if at["id"] < nv:
            toks[at["id"]] = at["content"]
            ttype[at["id"]] = gguf.TokenType.CONTROL if at["special"] else gguf.TokenType.USER_DEFINED
    for i in range(nv):
        if toks[i] is None:
            toks[i] = f"[PAD{i}]"
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(bpe_pre(tok))
    w.add_token_list(toks)
    w.add_token_types(ttype)
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg.get("bos_token_id", 0))
    w.add_eos_token_id(cfg.get("eos_token_id", 0))
    w.add_add_bos_token(adds_bos(tok, cfg.get("bos_token_id")))


# llama.cpp's pre-tokenizer names for the split regexes of the tokenizer.json files we convert
# (llama.cpp picks them by a hash of a test string's ids; here the regex itself says it)
BPE_PRE = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
}


def bpe_pre(tok):
    """llama.cpp's tokenizer.ggml.pre for a ByteLevel BPE tokenizer.json: llama-bpe or qwen2 for
    their split regex, gpt-2 otherwise (ByteLevel's own regex)."""
    pt = tok.get("pre_tokenizer") or {}
    for p in pt.get("pretokenizers", [pt]):
        if p.get("type") == "Split":
            rx = (p.get("pattern") or {}).get("Regex")
            if rx in BPE_PRE:
                return BPE_PRE[rx]
    return "gpt-2"


def adds_bos(tok, bos):
    """Whether the tokenizer.json's post-processor puts the BOS token first (Llama 3's does)."""
    pp = tok.get("post_processor") or {}
    for p in pp.get("processors", [pp]):
        if p.get("type") == "TemplateProcessing":
            first = (p.get("single") or [{}])[0]
            st = first.get("SpecialToken")
            ids = (p.get("special_tokens") or {}).get(st["id"], {}).get("ids", []) if st else []
            return bos is not None and ids == [bos]
    return False


def add_wordpiece(w, src, cfg, nv):
    """A WordPiece tokenizer.json as llama.cpp's BertModel.set_vocab writes it (tokenizer model bert)."""
    with open(os.path.join(src, "tokenizer.json")) as f:
        tok = json.load(f)
    if tok["model"].get("type") != "WordPiece":
        sys.exit("hf2gguf: bert needs a WordPiece tokenizer.json")
    toks = [None] * nv
    ttype = [gguf.TokenType.UNUSED] * nv
    for t, i in tok["model"]["vocab"].items():
        if i < nv:
            toks[i] = t[2:] if t.startswith("##") else "\u2581" + t
            ttype[i] = gguf.TokenType.NORMAL
    special = {}
    for at in tok.get("added_tokens", []):
        if at["id"] < nv and at["special"]:
            toks[at["id"]] = at["content"]
            ttype[at["id"]] = gguf.TokenType.CONTROL
            special[at["content"]] = at["id"]
    for i in range(nv):
        if toks[i] is None:
            toks[i] = f"[PAD{i}]"
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types(ttype)
    norm = tok.get("normalizer") or {}
    w.add_bool(gguf.Keys.Tokenizer.NORMALIZER_LOWERCASE, bool(norm.get("lowercase", True)))
    for key, add in (("[CLS]", w.add_bos_token_id), ("[SEP]", w.add_sep_token_id), ("[UNK]", w.add_unk_token_id),
                     ("[PAD]", w.add_pad_token_id), ("[MASK]", w.add_mask_token_id)):
        if key in special:
            add(special[key])
    w.add_add_bos_token(True)
    w.add_add_sep_token(True)


def st_pooling(src):
    """The pooling mode of a sentence-transformers folder (modules.json -> */config.json), or None."""
    try:
        with open(os.path.join(src, "modules.json")) as f:
            mods = json.load(f)
    except OSError:
        return None
    for m in mods:
        if m.get("type", "").endswith("Pooling"):
            with open(os.path.join(src, m.get("path", ""), "config.json")) as f:
                pc = json.load(f)
            mode = pc.get("pooling_mode")
            for k, v in (("pooling_mode_cls_token", "cls"), ("pooling_mode_mean_tokens", "mean"),
                         ("pooling_mode_lasttoken", "lasttoken")):
                if pc.get(k):
                    mode = v
            table = {"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS, "lasttoken": gguf.PoolingType.LAST}
            if mode not in table:
                sys.exit(f"hf2gguf: pooling {mode!r}: llama.cpp has mean, cls and last")
            return table[mode]
    return None


def moe_plan(mt, index, L, NE):
    """The expert tensors of one MoE layer family: [(gguf name, shape, dtype, producer)]."""
    plan = []
    for b in range(L):
        pre = f"model.layers.{b}.mlp.experts"
        if mt == "qwen3_moe":
            for proj, g in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
                srcs = [f"{pre}.{e}.{proj}.weight" for e in range(NE)]
                for n in srcs:
                    if n not in index:
                        sys.exit(f"hf2gguf: {n} missing")
                shape = [NE] + index[srcs[0]][1]["shape"]
                plan.append((f"blk.{b}.{g}.weight", shape, np.float16,
                             lambda srcs=srcs: np.stack([load(index, n) for n in srcs])))
        else:  # gpt_oss: gate_up [E, H, 2I] (gate even columns, up odd), down [E, I, H]
            gu, d = f"{pre}.gate_up_proj", f"{pre}.down_proj"
            E, H, I2 = index[gu][1]["shape"]
            I = I2 // 2
            plan += [
                (f"blk.{b}.ffn_gate_exps.weight", [E, I, H], np.float16,
                 lambda gu=gu: load(index, gu)[:, :, 0::2].transpose(0, 2, 1)),
                (f"blk.{b}.ffn_up_exps.weight", [E, I, H], np.float16,
                 lambda gu=gu: load(index, gu)[:, :, 1::2].transpose(0, 2, 1)),
                (f"blk.{b}.ffn_down_exps.weight", [E, H, I], np.float16,
                 lambda d=d: load(index, d).transpose(0, 2, 1)),
                (f"blk.{b}.ffn_gate_exps.bias", [E, I], np.float32,
                 lambda gu=gu: load(index, gu + "_bias")[:, 0::2]),
                (f"blk.{b}.ffn_up_exps.bias", [E, I], np.float32,
                 lambda gu=gu: load(index, gu + "_bias")[:, 1::2]),
                (f"blk.{b}.ffn_down_exps.bias", [E, H], np.float32,
                 lambda d=d: load(index, d + "_bias")),
            ]
    return plan


def f32_rule(g, ndim):
    """llama.cpp's converter: vectors, norms, routers, conv kernels and tensors not named
    `.weight` (ssm_a, ssm_d, biases) stay F32; other matrices are F16."""
    if ndim < 2 or g.endswith("_norm.weight") or not g.endswith(".weight"):
        return True
    return any(k in g for k in (".ffn_gate_inp.", ".ffn_gate_inp_shexp.", ".ssm_conv1d."))


def need(index, name):
    if name not in index:
        sys.exit(f"hf2gguf: {name} missing")
    return name


def tensor(index, g, name, fn=None, shape=None):
    """A plan entry for one checkpoint tensor: fn maps its float32 values, shape (numpy order)
    is the result's when fn changes it."""
    need(index, name)
    shape = shape or index[name][1]["shape"]
    dt = np.float32 if f32_rule(g, len(shape)) else np.float16
    return (g, list(shape), dt, (lambda: fn(load(index, name))) if fn else (lambda: load(index, name)))


def granite_hybrid_plan(index, cfg, attn):
    """granitemoehybrid -> llama.cpp granitehybrid: Mamba-2 mixers (A = -exp(A_log) and D as
    [heads, 1], conv1d [C, 1, K] -> [C, K], the gated norm as [groups, inner / groups],
    dt_bias -> ssm_dt.bias), attention q/k rows permuted as Llama's, input_linear [E, 2I, H]
    split into gate (first I rows) and up, the shared MLP's [2S, H] likewise (ffn_*_shexp
    beside experts, plain ffn_* without)."""
    L, H = cfg["num_hidden_layers"], cfg["hidden_size"]
    NH, NKV = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    NE = cfg.get("num_local_experts") or 0
    nh, ng = cfg["mamba_n_heads"], cfg.get("mamba_n_groups", 1)
    inner = nh * cfg["mamba_d_head"]
    I, S = cfg["intermediate_size"], cfg["shared_intermediate_size"]
    p = [tensor(index, "token_embd.weight", "model.embed_tokens.weight")]
    for b in range(L):
        pre, blk = f"model.layers.{b}.", f"blk.{b}."
        p.append(tensor(index, blk + "attn_norm.weight", pre + "input_layernorm.weight"))
        if b in attn:
            for x, g, nperm in (("q", "attn_q", NH), ("k", "attn_k", NKV), ("v", "attn_v", 0), ("o", "attn_output", 0)):
                fn = (lambda w, n=nperm: permute(w, n)) if nperm else None
                p.append(tensor(index, blk + g + ".weight", pre + f"self_attn.{x}_proj.weight", fn))
        else:
            m = pre + "mamba."
            C = index[need(index, m + "conv1d.weight")][1]["shape"][0]
            p += [tensor(index, blk + "ssm_in.weight", m + "in_proj.weight"),
                  tensor(index, blk + "ssm_conv1d.weight", m + "conv1d.weight", lambda w: w.reshape(w.shape[0], -1),
                         [C, cfg.get("mamba_d_conv", 4)])]
            if m + "conv1d.bias" in index:
                p.append(tensor(index, blk + "ssm_conv1d.bias", m + "conv1d.bias"))
            p += [tensor(index, blk + "ssm_dt.bias", m + "dt_bias"),
                  tensor(index, blk + "ssm_a", m + "A_log", lambda a: -np.exp(a).reshape(-1, 1), [nh, 1]),
                  tensor(index, blk + "ssm_d", m + "D", lambda d: d.reshape(-1, 1), [nh, 1]),
                  tensor(index, blk + "ssm_norm.weight", m + "norm.weight", lambda w: w.reshape(ng, -1), [ng, inner // ng]),
                  tensor(index, blk + "ssm_out.weight", m + "out_proj.weight")]
            if m + "out_proj.bias" in index or m + "in_proj.bias" in index:
                sys.exit("hf2gguf: granitemoehybrid with mamba_proj_bias: llama.cpp's granitehybrid has no projection biases")
        p.append(tensor(index, blk + "ffn_norm.weight", pre + "post_attention_layernorm.weight"))
        sh = ("_shexp" if NE else "")
        si = pre + "shared_mlp.input_linear.weight"
        p += [tensor(index, blk + f"ffn_gate{sh}.weight", si, lambda w: w[:S], [S, H]),
              tensor(index, blk + f"ffn_up{sh}.weight", si, lambda w: w[S:], [S, H]),
              tensor(index, blk + f"ffn_down{sh}.weight", pre + "shared_mlp.output_linear.weight")]
        if NE:
            e = pre + "block_sparse_moe."
            p += [tensor(index, blk + "ffn_gate_inp.weight", e + "router.layer.weight"),
                  tensor(index, blk + "ffn_gate_exps.weight", e + "input_linear.weight", lambda w: w[:, :I], [NE, I, H]),
                  tensor(index, blk + "ffn_up_exps.weight", e + "input_linear.weight", lambda w: w[:, I:], [NE, I, H]),
                  tensor(index, blk + "ffn_down_exps.weight", e + "output_linear.weight")]
    p.append(tensor(index, "output_norm.weight", "model.norm.weight"))
    if not cfg.get("tie_word_embeddings", True):
        p.append(tensor(index, "output.weight", "lm_head.weight"))
    return p


def qwen3next_plan(index, cfg, full):
    """qwen3_next -> llama.cpp qwen3next: the zero-centred RMSNorm weights w stored as 1 + w
    (every norm but the gated one of the linear attention), A = -exp(A_log), conv1d squeezed,
    in_proj_qkvz's per-key-head [q k v z] groups regrouped into one [q | k | v] matrix
    (attn_qkv) and z (attn_gate), in_proj_ba as is (ssm_ba), the per-expert matrices stacked."""
    L, H = cfg["num_hidden_layers"], cfg["hidden_size"]
    NE = cfg["num_experts"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    K = cfg.get("linear_conv_kernel_dim", 4)
    vg = nv // nk * dv  # v (and z) rows per key head

    def qkvz(w):  # [nk * (2 dk + 2 vg), H] -> [q | k | v] rows, z rows
        w = w.reshape(nk, 2 * dk + 2 * vg, H)
        q, k, v, z = w[:, :dk], w[:, dk:2 * dk], w[:, 2 * dk:2 * dk + vg], w[:, 2 * dk + vg:]
        return np.concatenate([q.reshape(-1, H), k.reshape(-1, H), v.reshape(-1, H)]), z.reshape(-1, H)

    plus1 = lambda w: w + 1.0
    p = [tensor(index, "token_embd.weight", "model.embed_tokens.weight")]
    for b in range(L):
        pre, blk = f"model.layers.{b}.", f"blk.{b}."
        p.append(tensor(index, blk + "attn_norm.weight", pre + "input_layernorm.weight", plus1))
        if b in full:
            a = pre + "self_attn."
            p += [tensor(index, blk + f"attn_{x}.weight", a + f"{x}_proj.weight") for x in ("q", "k", "v")]
            p += [tensor(index, blk + "attn_output.weight", a + "o_proj.weight"),
                  tensor(index, blk + "attn_q_norm.weight", a + "q_norm.weight", plus1),
                  tensor(index, blk + "attn_k_norm.weight", a + "k_norm.weight", plus1)]
        else:
            a = pre + "linear_attn."
            src = a + "in_proj_qkvz.weight"
            p += [tensor(index, blk + "attn_qkv.weight", src, lambda w: qkvz(w)[0], [nk * 2 * dk + nv * dv, H]),
                  tensor(index, blk + "attn_gate.weight", src, lambda w: qkvz(w)[1], [nv * dv, H]),
                  tensor(index, blk + "ssm_conv1d.weight", a + "conv1d.weight", lambda w: w.reshape(w.shape[0], -1),
                         [2 * nk * dk + nv * dv, K]),
                  tensor(index, blk + "ssm_dt.bias", a + "dt_bias"),
                  tensor(index, blk + "ssm_a", a + "A_log", lambda x: -np.exp(x)),
                  tensor(index, blk + "ssm_ba.weight", a + "in_proj_ba.weight"),
                  tensor(index, blk + "ssm_norm.weight", a + "norm.weight"),
                  tensor(index, blk + "ssm_out.weight", a + "out_proj.weight")]
        p.append(tensor(index, blk + "post_attention_norm.weight", pre + "post_attention_layernorm.weight", plus1))
        m = pre + "mlp."
        p.append(tensor(index, blk + "ffn_gate_inp.weight", m + "gate.weight"))
        for proj, g in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            srcs = [need(index, f"{m}experts.{e}.{proj}.weight") for e in range(NE)]
            p.append((f"{blk}{g}.weight", [NE] + index[srcs[0]][1]["shape"], np.float16,
                      lambda srcs=srcs: np.stack([load(index, n) for n in srcs])))
        p += [tensor(index, blk + "ffn_gate_inp_shexp.weight", m + "shared_expert_gate.weight", lambda w: w.reshape(-1), [H])]
        p += [tensor(index, blk + f"ffn_{x}_shexp.weight", m + f"shared_expert.{x}_proj.weight") for x in ("gate", "up", "down")]
    p.append(tensor(index, "output_norm.weight", "model.norm.weight", plus1))
    if not cfg.get("tie_word_embeddings", False):
        p.append(tensor(index, "output.weight", "lm_head.weight"))
    return p


Q4_0 = "q4_0"  # a plan dtype: Q4_0 blocks of the F16-rounded values


def q4_0_of(g, shape, dt):
    """Whether `llama-quantize --pure Q4_0` quantizes this tensor of the F16 GGUF: every F16
    matrix but the MoE router (and norms, conv kernels, ... which are F32 here already)."""
    if dt != np.float16 or len(shape) < 2 or "ffn_gate_inp.weight" in g or "_norm.weight" in g:
        return False
    if shape[-1] % 32:
        sys.exit(f"hf2gguf: {g} rows of {shape[-1]} are not whole Q4_0 blocks; write F16 and use llama-quantize")
    return True


def with_outtype(plan, outtype):
    """The plan's dtypes for --outtype: f16 as planned, f32 every tensor F32 (a reference without
    F16 rounding), q4_0 the tensors llama-quantize --pure Q4_0 quantizes as Q4_0."""
    if outtype == "f32":
        return [(g, shape, np.float32, get) for g, shape, _, get in plan]
    if outtype == Q4_0:
        return [(g, shape, Q4_0 if q4_0_of(g, shape, dt) else dt, get) for g, shape, dt, get in plan]
    return plan


def add_file_type(w, outtype):
    """general.file_type (and, for Q4_0, general.quantization_version, as llama-quantize sets them)."""
    if outtype == Q4_0:
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    elif outtype == "f32":
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
    else:
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)


Q4_THREADS = 1  # --threads


def q4_0(x):
    """x [..., n] (n % 32 == 0) as Q4_0 bytes [..., n / 32 * 18]: the values rounded to F16 first,
    then gguf-py's reference Q4_0 (ggml's quantize_row_q4_0_ref), so the bytes are those
    llama-quantize --pure Q4_0 makes of the F16 GGUF; a few thousand rows at a time (memory)."""
    rows = x.reshape(-1, x.shape[-1])
    out = np.empty((rows.shape[0], rows.shape[1] // 32 * 18), np.uint8)

    # a few thousand rows at a time; threaded, at least two parts a thread where the rows allow
    step = 4096 if Q4_THREADS == 1 else min(4096, max(256, -(-rows.shape[0] // (2 * Q4_THREADS))))

    def part(r):
        out[r:r + step] = gguf.quants.quantize(rows[r:r + step].astype(np.float16).astype(np.float32),
                                               gguf.GGMLQuantizationType.Q4_0)
    starts = range(0, rows.shape[0], step)
    if Q4_THREADS > 1 and len(starts) > 1:  # numpy lets go of the GIL inside each operation
        with concurrent.futures.ThreadPoolExecutor(min(Q4_THREADS, len(starts))) as ex:
            list(ex.map(part, starts))
    else:
        for r in starts:
            part(r)
    return out.reshape(*x.shape[:-1], -1)


def write_plan(w, plan):
    """Header, then each planned (gguf name, shape, dtype, producer) tensor, one in memory at a
    time; dtype Q4_0 (with_outtype) is quantized by q4_0()."""
    for g, shape, dt, _ in plan:
        if dt == Q4_0:
            bshape = gguf.quant_shape_to_byte_shape(shape, gguf.GGMLQuantizationType.Q4_0)
            w.add_tensor_info(g, bshape, np.dtype(np.uint8), int(np.prod(bshape)),
                              raw_dtype=gguf.GGMLQuantizationType.Q4_0)
        else:
            w.add_tensor_info(g, shape, np.dtype(dt), int(np.prod(shape)) * np.dtype(dt).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for g, shape, dt, get in plan:
        x = get()
        if list(x.shape) != list(shape):
            sys.exit(f"hf2gguf: {g} has shape {list(x.shape)}, planned {shape}")
        x = q4_0(np.asarray(x, dtype=np.float32)) if dt == Q4_0 else np.ascontiguousarray(x, dtype=dt)
        w.write_tensor_data(x)
        del x
    w.close()


def write_hybrid(w, mt, src, cfg, index, attn, outtype, out):
    add_file_type(w, outtype)
    add_tokenizer(w, src, cfg, cfg["vocab_size"])
    if mt == "granitemoehybrid":
        plan = granite_hybrid_plan(index, cfg, attn)
    else:
        plan = qwen3next_plan(index, cfg, attn)
    write_plan(w, with_outtype(plan, outtype))
    print(f"hf2gguf: wrote {out}: {len(plan)} tensors", file=sys.stderr)


def layer_kinds(cfg, mt):
    """The attention layers of a hybrid: granitemoehybrid's layer_types ("attention" /
    "full_attention" against "mamba" / "linear_attention"; absent: all Mamba-2) or
    qwen3_next's (absent: every full_attention_interval-th layer)."""
    L = cfg["num_hidden_layers"]
    lt = cfg.get("layer_types")
    if lt is not None and len(lt) != L:
        sys.exit(f"hf2gguf: layer_types has {len(lt)} entries, num_hidden_layers is {L}")
    if mt == "granitemoehybrid":
        attn, ssm = ("attention", "full_attention"), ("mamba", "linear_attention")
    else:
        attn, ssm = ("full_attention",), ("linear_attention",)
    if lt is None:
        if mt == "granitemoehybrid":
            return set()
        n = cfg.get("full_attention_interval", 4)
        return {i for i in range(L) if (i + 1) % n == 0}
    for t in lt:
        if t not in attn + ssm:
            sys.exit(f"hf2gguf: {mt} layer_types entry {t!r} not handled")
    return {i for i, t in enumerate(lt) if t in attn}


def hybrid_header(w, mt, cfg, attn):
    """The metadata llama.cpp's granitehybrid / qwen3next read, as its converter writes it."""
    L, NH = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    NKV = cfg.get("num_key_value_heads") or NH
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(L)
    w.add_head_count(NH)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    if mt == "granitemoehybrid":
        if cfg.get("hidden_act", "silu") != "silu":
            sys.exit("hf2gguf: granitemoehybrid hidden_act other than silu")
        if cfg.get("mamba_expand", 2) != 2 or cfg["mamba_n_heads"] * cfg["mamba_d_head"] != 2 * cfg["hidden_size"]:
            sys.exit("hf2gguf: granitehybrid in llama.cpp needs mamba_n_heads * mamba_d_head = 2 * hidden_size")
        if cfg.get("mamba_n_groups", 1) != 1:
            # transformers (BambaRMSNormGated) and mlx-lm normalize the gated output over the whole
            # inner row, llama.cpp's granitehybrid over each group: the same only for one group
            sys.exit("hf2gguf: granitemoehybrid with mamba_n_groups > 1: llama.cpp normalizes the gated "
                     "output per group, transformers over the whole row, so no GGUF is a twin")
        NE = cfg.get("num_local_experts") or 0
        rope = (cfg.get("position_embedding_type") or "rope") == "rope"  # as mlxcel reads it
        w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
        w.add_context_length(cfg.get("max_position_embeddings", 2048) if rope else 2 ** 20)
        w.add_rope_scaling_finetuned(rope)  # llama.cpp's granitehybrid: rope on or off
        w.add_rope_dimension_count(cfg["hidden_size"] // NH)
        # the dense model's FFN is its shared MLP
        w.add_feed_forward_length(cfg["intermediate_size"] if NE else cfg["shared_intermediate_size"])
        w.add_head_count_kv([NKV if i in attn else 0 for i in range(L)])  # 0: a Mamba-2 layer
        for key, add in (("attention_multiplier", w.add_attention_scale), ("embedding_multiplier", w.add_embedding_scale),
                         ("residual_multiplier", w.add_residual_scale), ("logits_scaling", w.add_logit_scale)):
            if key in cfg:
                add(float(cfg[key]))
        if NE:
            w.add_expert_count(NE)
            w.add_expert_used_count(cfg["num_experts_per_tok"])
            w.add_expert_shared_feed_forward_length(cfg["shared_intermediate_size"])
        w.add_ssm_conv_kernel(cfg.get("mamba_d_conv", 4))
        w.add_ssm_state_size(cfg["mamba_d_state"])
        w.add_ssm_group_count(cfg.get("mamba_n_groups", 1))
        w.add_ssm_inner_size(cfg["mamba_n_heads"] * cfg["mamba_d_head"])
        w.add_ssm_time_step_rank(cfg["mamba_n_heads"])  # llama.cpp's name for the head count
    else:
        HD = cfg.get("head_dim") or cfg["hidden_size"] // NH
        if cfg["linear_key_head_dim"] != cfg["linear_value_head_dim"]:
            sys.exit("hf2gguf: qwen3next in llama.cpp needs linear_key_head_dim = linear_value_head_dim")
        if cfg.get("norm_topk_prob") is False:
            sys.exit("hf2gguf: qwen3_next with norm_topk_prob false: llama.cpp's qwen3next always normalizes")
        if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
            sys.exit("hf2gguf: qwen3_next with dense layers (mlp_only_layers, decoder_sparse_step) not handled")
        if cfg.get("rope_scaling"):
            sys.exit(f"hf2gguf: qwen3_next rope_scaling {cfg['rope_scaling']} not handled")
        w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
        w.add_context_length(cfg.get("max_position_embeddings", 2048))
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_head_count_kv(NKV)
        w.add_key_length(HD)
        w.add_value_length(HD)
        w.add_rope_dimension_count(int(HD * cfg.get("partial_rotary_factor", 0.25)))
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
        w.add_ssm_conv_kernel(cfg.get("linear_conv_kernel_dim", 4))
        w.add_ssm_state_size(cfg["linear_key_head_dim"])
        w.add_ssm_group_count(cfg["linear_num_key_heads"])
        w.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
        w.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
        w.add_recurrent_layers([i not in attn for i in range(L)])
        w.add_full_attention_interval(cfg.get("full_attention_interval", 4))


# transformers 5 / 4 prefixes of the image-text checkpoints -> the names gguf-py's tables know
VLM_PREFIXES = (
    ("model.language_model.", "model."), ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."), ("model.lm_head.", "lm_head."),
    ("model.vision_tower.vision_model.", "vision_tower.vision_model."),
    ("model.vision_tower.", "vision_tower.vision_model."),
    ("vision_tower.vision_model.", "vision_tower.vision_model."),
    ("vision_tower.", "vision_tower.vision_model."),
    ("model.multi_modal_projector.", "multi_modal_projector."), ("model.visual.", "visual."),
)
VLM_TYPES = ("gemma3", "qwen2_5_vl")


def vlm_rename(index):
    """{canonical name: index entry} of an image-text checkpoint."""
    out = {}
    for name, v in index.items():
        n = name
        for a, b in VLM_PREFIXES:
            if n.startswith(a):
                n = b + n[len(a):]
                break
        n = n.replace("mm_input_projection_weight", "mm_input_projection.weight")
        if n in out:
            sys.exit(f"hf2gguf: two tensors named {n}")
        out[n] = v
    return out


def is_vision(name):
    return name.startswith(("vision_tower.", "multi_modal_projector.", "visual."))


def preprocessor(src):
    """preprocessor_config.json with processor_config.json's image_processor over it (as the converter)."""
    pc = {}
    for fn in ("preprocessor_config.json", "processor_config.json"):
        try:
            with open(os.path.join(src, fn)) as f:
                c = json.load(f)
        except OSError:
            continue
        pc.update(c)
        pc.update(c.get("image_processor") or {})
    return pc


def write_mmproj(src, cfg, index, out):
    """The vision tower and projector of a gemma3 / qwen2_5_vl checkpoint as llama.cpp's clip GGUF."""
    mt = cfg["model_type"]
    vc = cfg.get("vision_config") or sys.exit("hf2gguf: --mmproj needs a vision_config")
    tc = {**cfg, **(cfg.get("text_config") or {})}
    pc = preprocessor(src)
    w = gguf.GGUFWriter(out, "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_name(f"synthetic-{os.path.basename(os.path.normpath(src))}-mmproj")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_clip_has_vision_encoder(True)
    w.add_vision_projection_dim(tc["hidden_size"])
    if mt == "gemma3":
        L = vc["num_hidden_layers"]
        w.add_clip_projector_type(gguf.VisionProjectorType.GEMMA3)
        w.add_vision_image_size(vc["image_size"])
        w.add_vision_patch_size(vc["patch_size"])
        w.add_vision_embedding_length(vc["hidden_size"])
        w.add_vision_feed_forward_length(vc["intermediate_size"])
        w.add_vision_block_count(L)
        w.add_vision_head_count(vc["num_attention_heads"])
        w.add_vision_attention_layernorm_eps(vc.get("layer_norm_eps", 1e-6))
        w.add_vision_use_gelu(True)
        side = int(round((cfg.get("mm_tokens_per_image") or pc.get("image_seq_length") or 256) ** 0.5))
        scale = (vc["image_size"] // vc["patch_size"]) // side
        if scale > 0 and scale != 4:
            w.add_vision_projector_scale_factor(scale)
    else:
        L = vc["depth"]
        fa = vc.get("fullatt_block_indexes") or sys.exit("hf2gguf: qwen2_5_vl needs fullatt_block_indexes")
        n_wa = fa[0] + 1
        if any(b - a != n_wa for a, b in zip(fa, fa[1:])):
            sys.exit(f"hf2gguf: fullatt_block_indexes {fa} are not evenly spaced (llama.cpp's n_wa_pattern)")
        if vc.get("window_size", 112) != 112:
            sys.exit(f"hf2gguf: qwen2_5_vl window_size {vc.get('window_size')}: llama.cpp's clip uses 112")
        if vc.get("spatial_merge_size", 2) != 2 or vc.get("temporal_patch_size", 2) != 2:
            sys.exit("hf2gguf: qwen2_5_vl with spatial_merge_size or temporal_patch_size other than 2")
        w.add_clip_projector_type(gguf.VisionProjectorType.QWEN25VL)
        w.add_vision_image_size(vc.get("image_size", 560))
        w.add_vision_patch_size(vc["patch_size"])
        w.add_vision_embedding_length(vc["hidden_size"])
        w.add_vision_feed_forward_length(vc["intermediate_size"])
        w.add_vision_block_count(L)
        w.add_vision_head_count(vc["num_heads"])
        w.add_vision_use_silu(True)
        w.add_vision_n_wa_pattern(n_wa)
        w.add_vision_attention_layernorm_eps(tc.get("rms_norm_eps", 1e-6))
    w.add_vision_image_mean([float(x) for x in pc.get("image_mean", [0.5, 0.5, 0.5])])
    w.add_vision_image_std([float(x) for x in pc.get("image_std", [0.5, 0.5, 0.5])])

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, L)
    plan = []
    def put(g, shape, dt, get):
        plan.append((g, list(shape), dt, get))
    for name in sorted((n for n in index if is_vision(n)), key=lambda n: (n.split(".")[2:3], n)):
        shape = index[name][1]["shape"]
        get = lambda name=name: load(index, name)
        if mt == "gemma3" and "vision_model.head." in name:
            continue  # SigLIP's pooling head: unused by Gemma 3
        if mt == "qwen2_5_vl" and name.endswith("patch_embed.proj.weight"):
            if len(shape) != 5 or shape[2] != 2:
                sys.exit(f"hf2gguf: {name} {shape}: a temporal patch conv [out, C, 2, p, p]")
            s2 = [shape[0], shape[1], shape[3], shape[4]]
            put("v.patch_embd.weight", s2, np.float16, lambda get=get: get()[:, :, 0])
            put("v.patch_embd.weight.1", s2, np.float16, lambda get=get: get()[:, :, 1])
            continue
        if mt == "qwen2_5_vl" and ".attn.qkv." in name:
            c = shape[0] // 3
            for i, part in enumerate("qkv"):
                base = name.replace(".qkv.", f".{part}.")
                g = names.get_name(base, try_suffixes=(".weight", ".bias"))
                if g is None:
                    sys.exit(f"hf2gguf: no GGUF name for {base}")
                put(g, [c] + shape[1:], np.float32 if len(shape) < 2 else np.float16,
                    lambda get=get, i=i: get()[i * c:(i + 1) * c])
            continue
        g = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if g is None:
            sys.exit(f"hf2gguf: no GGUF name for {name}")
        f32 = len(shape) < 2 or (mt == "gemma3" and ".embeddings." in name)
        if name.endswith("soft_emb_norm.weight"):  # Gemma3RMSNorm: x * (1 + w)
            get = lambda get=get: get() + 1.0
        put(g, shape, np.float32 if f32 else np.float16, get)
    write_plan(w, plan)
    print(f"hf2gguf: wrote {out}: {len(plan)} tensors", file=sys.stderr)


def rope_of(tc):
    """(global theta, local theta, linear factor of the global layers, mrope sections) of a text config
    in transformers 5's rope_parameters or 4's rope_theta / rope_local_base_freq / rope_scaling."""
    rp = tc.get("rope_parameters") or {}
    full = rp.get("full_attention", rp)
    slide = rp.get("sliding_attention") or {}
    rs = tc.get("rope_scaling") or {}
    theta = float(full.get("rope_theta", tc.get("rope_theta", 1e6 if tc.get("model_type", "").startswith("gemma3") else 1e4)))
    local = float(slide.get("rope_theta", tc.get("rope_local_base_freq", 10000.0)))
    scal = full if full.get("rope_type", full.get("type")) not in (None, "default") else rs
    kind = scal.get("rope_type", scal.get("type"))
    if kind in (None, "default", "mrope"):
        factor = None
    elif kind == "linear":
        factor = float(scal["factor"])
    else:
        sys.exit(f"hf2gguf: rope {kind!r} not handled here (default, linear)")
    mrope = full.get("mrope_section") or rs.get("mrope_section")
    return theta, local, factor, mrope


FAMILIES = ("llama", "phi", "bert", "qwen3", "qwen3_moe", "gpt_oss", "granitemoehybrid", "qwen3_next") + VLM_TYPES


def main():
    ap = argparse.ArgumentParser(prog="hf2gguf.py", allow_abbrev=False,
                                 description="A GGUF twin of a float Hugging Face / MLX checkpoint folder for "
                                             f"llama.cpp. model_type: {', '.join(FAMILIES)} (the script's "
                                             "docstring says how each is written).")
    ap.add_argument("src", metavar="SRC_FOLDER",
                    help="the checkpoint folder (config.json, *.safetensors, tokenizer.json)")
    ap.add_argument("out", metavar="OUT.gguf", help="the language model's GGUF")
    ap.add_argument("--outtype", choices=("f16", "f32", Q4_0), default="f16",
                    help="OUT.gguf's tensors: f16 (default; vectors F32), f32 (all F32), or q4_0 (the bytes "
                         "llama-quantize --pure Q4_0 makes of the f16 file)")
    ap.add_argument("--mmproj", metavar="MMPROJ.gguf",
                    help="also write the vision tower and projector as llama.cpp's clip GGUF (gemma3, qwen2_5_vl; "
                         "F16/F32 whatever --outtype)")
    ap.add_argument("--threads", type=int, default=1, metavar="N",
                    help="threads quantizing each q4_0 tensor (default 1; the bytes are the same for any N)")
    a = ap.parse_args()
    if not 1 <= a.threads <= 256:
        ap.error("--threads: 1 to 256")
    global Q4_THREADS
    Q4_THREADS = a.threads
    src, out, outtype, mmproj = a.src, a.out, a.outtype, a.mmproj
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    mt = cfg.get("model_type")
    index = read_index(src)
    top = cfg
    if mt in VLM_TYPES:
        index = vlm_rename(index)
        if mmproj:
            write_mmproj(src, cfg, index, mmproj)
        index = {n: v for n, v in index.items() if not is_vision(n)}
        cfg = {**cfg, **(cfg.get("text_config") or {})}
        cfg["model_type"] = mt
    elif mmproj:
        sys.exit(f"hf2gguf: --mmproj: model_type {mt!r} has no vision writer ({', '.join(VLM_TYPES)})")
    H, L, NH = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    NKV = cfg.get("num_key_value_heads") or NH
    NV = cfg["vocab_size"]
    HD = cfg.get("head_dim") or H // NH
    ctx = cfg.get("max_position_embeddings", 2048)
    NE = cfg.get("num_local_experts") or cfg.get("num_experts") or 0
    KE = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0

    if mt == "llama":
        arch = gguf.MODEL_ARCH.LLAMA
        w = gguf.GGUFWriter(out, "llama")
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_rope_dimension_count(HD)
        w.add_vocab_size(NV)
    elif mt == "phi":
        arch = gguf.MODEL_ARCH.PHI2
        w = gguf.GGUFWriter(out, "phi2")
        w.add_layer_norm_eps(cfg["layer_norm_eps"])
        w.add_rope_dimension_count(int(cfg.get("partial_rotary_factor", 0.5) * HD))
    elif mt == "bert":
        arch = gguf.MODEL_ARCH.BERT
        w = gguf.GGUFWriter(out, "bert")
        w.add_layer_norm_eps(cfg["layer_norm_eps"])
        w.add_causal_attention(False)
        w.add_token_type_count(cfg.get("type_vocab_size", 1))
        if cfg.get("hidden_act", "gelu") not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
            sys.exit(f"hf2gguf: bert hidden_act {cfg.get('hidden_act')!r}: llama.cpp's bert is GELU")
        pool = st_pooling(src)
        if pool is not None:
            w.add_pooling_type(pool)
    elif mt == "qwen3":
        arch = gguf.MODEL_ARCH.QWEN3
        w = gguf.GGUFWriter(out, "qwen3")
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_key_length(HD)
        w.add_value_length(HD)
        pool = st_pooling(src)
        if pool is not None:
            w.add_pooling_type(pool)
    elif mt == "qwen3_moe":
        arch = gguf.MODEL_ARCH.QWEN3MOE
        w = gguf.GGUFWriter(out, "qwen3moe")
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if cfg.get("norm_topk_prob") is False:
            sys.exit("hf2gguf: qwen3_moe with norm_topk_prob false: llama.cpp's qwen3moe always normalizes")
        if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
            sys.exit("hf2gguf: qwen3_moe with dense layers (mlp_only_layers, decoder_sparse_step) not handled")
    elif mt == "gpt_oss":
        arch = gguf.MODEL_ARCH.GPT_OSS
        w = gguf.GGUFWriter(out, "gpt-oss")
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_expert_feed_forward_length(cfg["intermediate_size"])
        w.add_sliding_window(cfg["sliding_window"])
        lt = cfg.get("layer_types") or []
        want = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)]
        if lt and lt[:L] != want:
            sys.exit("hf2gguf: gpt_oss layer_types must alternate sliding/full from layer 0 (llama.cpp's pattern)")
        if cfg.get("swiglu_limit", 7.0) != 7.0:
            sys.exit("hf2gguf: gpt_oss swiglu_limit other than 7 (llama.cpp's constant)")
        rs = cfg.get("rope_scaling") or {}
        if rs.get("rope_type", rs.get("type")) == "yarn":
            # transformers: a stated original context makes the factor max_position_embeddings /
            # original (the published config states both, 131072 / 4096 = 32)
            orig = int(rs.get("original_max_position_embeddings") or ctx)
            factor = ctx / orig if "original_max_position_embeddings" in rs else float(rs["factor"])
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(factor)
            w.add_rope_scaling_orig_ctx_len(orig)
            if "beta_fast" in rs:
                w.add_rope_scaling_yarn_beta_fast(float(rs["beta_fast"]))
            if "beta_slow" in rs:
                w.add_rope_scaling_yarn_beta_slow(float(rs["beta_slow"]))
            if rs.get("attention_factor") is not None:
                w.add_rope_scaling_yarn_attn_factor(float(rs["attention_factor"]))
        elif rs:
            sys.exit(f"hf2gguf: gpt_oss rope_scaling {rs} not handled (yarn only)")
    elif mt in ("granitemoehybrid", "qwen3_next"):
        arch = None
        w = gguf.GGUFWriter(out, "granitehybrid" if mt == "granitemoehybrid" else "qwen3next")
        attn = layer_kinds(cfg, mt)
        hybrid_header(w, mt, cfg, attn)
    elif mt == "gemma3":
        arch = gguf.MODEL_ARCH.GEMMA3
        w = gguf.GGUFWriter(out, "gemma3")
        theta, local, factor, _ = rope_of(cfg)
        w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
        w.add_key_length(HD)
        w.add_value_length(HD)
        if cfg.get("attn_logit_softcapping") is not None:
            sys.exit("hf2gguf: gemma3 with attn_logit_softcapping (llama.cpp's gemma3 has none)")
        if cfg.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        qs = cfg.get("query_pre_attn_scalar", HD)
        if qs != HD:  # llama.cpp scales by 1/sqrt(head_dim) except at 27B's layer count
            sys.exit(f"hf2gguf: gemma3 query_pre_attn_scalar {qs} != head_dim {HD}: llama.cpp scales by head_dim")
        lt = cfg.get("layer_types") or []
        if len(lt) != L:
            pat = cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6
            lt = ["full_attention" if (i + 1) % pat == 0 else "sliding_attention" for i in range(L)]
        w.add_sliding_window(cfg["sliding_window"])
        w.add_sliding_window_pattern([t == "sliding_attention" for t in lt])
        w.add_rope_freq_base_swa(local)
        if factor is not None:
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(factor)
        cfg["rope_theta"] = theta
    elif mt == "qwen2_5_vl":
        arch = gguf.MODEL_ARCH.QWEN2VL
        w = gguf.GGUFWriter(out, "qwen2vl")
        theta, _, factor, mrope = rope_of(cfg)
        if factor is not None or not mrope:
            sys.exit("hf2gguf: qwen2_5_vl needs mrope_section and no rope scaling")
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_rope_dimension_sections((list(mrope) + [0, 0, 0, 0])[:4])
        cfg["rope_theta"] = theta
    else:
        sys.exit(f"hf2gguf: model_type {mt!r} not handled ({', '.join(FAMILIES)})")
    moe = mt in ("qwen3_moe", "gpt_oss")
    hybrid = arch is None
    w.add_name(f"synthetic-{os.path.basename(os.path.normpath(src))}")
    if hybrid:
        return write_hybrid(w, mt, src, cfg, index, attn, outtype, out)
    w.add_context_length(ctx)
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    if moe:
        w.add_key_length(HD)
        w.add_value_length(HD)
        w.add_expert_count(NE)
        w.add_expert_used_count(KE)
    add_file_type(w, outtype)
    if mt == "bert":
        add_wordpiece(w, src, cfg, NV)
    else:
        add_tokenizer(w, src, cfg, NV)
        if mt == "qwen3" and pool == gguf.PoolingType.LAST:
            w.add_add_eos_token(True)  # the last token pooled is the <|endoftext|> the tokenizer appends

    names = gguf.get_tensor_name_map(arch, L)
    plan = []  # (gguf name, shape, numpy dtype, producer of the float32 values)
    def order(n):  # embedding, layers in order, then the rest
        parts = n.split(".")
        i = next((int(p) for p in parts if p.isdigit()), None)
        return (0 if "embed" in n else 1 if i is not None else 2, i or 0, n)

    experts = moe_plan(mt, index, L, NE) if moe else []
    for name in sorted(index, key=order):
        if moe and ".mlp.experts." in name:
            continue  # in `experts`
        if mt == "bert" and (name.startswith(("pooler.", "cls.")) or name.endswith("position_ids")):
            continue  # llama.cpp's bert embeds only: no pooler dense, no MLM head
        base = name + ".weight" if name.endswith(".sinks") else name
        g = names.get_name(base, try_suffixes=(".weight", ".bias"))
        if g is None:
            sys.exit(f"hf2gguf: no GGUF name for {name}")
        shape = index[name][1]["shape"]
        f32 = len(shape) < 2 or g.startswith(("position_embd.", "token_types."))  # as llama.cpp's converter
        plan.append((g, shape, np.float32 if f32 else np.float16, lambda name=name: load(index, name)))
    if mt in ("llama", "qwen3", "gemma3", "qwen2_5_vl") and top.get("tie_word_embeddings", cfg.get("tie_word_embeddings")) \
            and "lm_head.weight" in index:
        plan = [p for p in plan if p[0] != "output.weight"]  # llama.cpp ties on a missing output
    def place(p):  # the embedding, each layer (its experts after its other tensors), the rest
        g = p[0]
        if g.startswith("blk."):
            return (1, int(g.split(".")[1]), "_exps." in g)
        return (0 if g.startswith("token_embd") else 2, 0, False)
    plan = sorted(plan + experts, key=place)  # stable: each group keeps its own order

    def fix(g, get):  # llama's q/k permutation; Gemma's norms stored + 1 (llama.cpp's x * w)
        if mt == "llama" and g.endswith("attn_q.weight"):
            return lambda: permute(get(), NH)
        if mt == "llama" and g.endswith("attn_k.weight"):
            return lambda: permute(get(), NKV)
        if mt == "gemma3" and "norm" in g and g.endswith(".weight"):
            return lambda: get() + 1.0
        return get
    write_plan(w, with_outtype([(g, shape, dt, fix(g, get)) for g, shape, dt, get in plan], outtype))
    print(f"hf2gguf: wrote {out}: {len(plan)} tensors", file=sys.stderr)


if __name__ == "__main__":
    main()

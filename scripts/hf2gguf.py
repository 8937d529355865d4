#!/usr/bin/env python3
"""hf2gguf.py SRC OUT.gguf: an F16 GGUF of a float Hugging Face / MLX checkpoint folder, for llama.cpp.

The GGUF twin of a `mlxcel synth` model (scripts/bench-vs-llamacpp.sh): the same tensor values, so
llama.cpp and mlxcel run the same weights. Families: `llama` (arch llama; q/k rows permuted as
llama.cpp's convert_hf_to_gguf.py does) and `phi` (arch phi2; partial NEOX rotary, no permutation).
Without torch or transformers: numpy plus the gguf-py that ships inside the llama.cpp source
(PYTHONPATH=LLAMA_SRC/gguf-py), so it writes what that llama.cpp reads.

Matrices are written as F16, vectors (norms, biases) as F32, one tensor at a time (memory stays at
one tensor). The tokenizer is the folder's tokenizer.json (BPE, ByteLevel), padded to vocab_size
with `[PAD<id>]` tokens, pre-tokenizer gpt-2; llama-bench feeds token ids, so only its shape matters.
"""
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
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(toks)
    w.add_token_types(ttype)
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg.get("bos_token_id", 0))
    w.add_eos_token_id(cfg.get("eos_token_id", 0))
    w.add_add_bos_token(False)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: hf2gguf.py SRC_FOLDER OUT.gguf")
    src, out = sys.argv[1], sys.argv[2]
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    mt = cfg.get("model_type")
    index = read_index(src)
    H, L, NH = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    NKV = cfg.get("num_key_value_heads") or NH
    NV = cfg["vocab_size"]
    HD = cfg.get("head_dim") or H // NH
    ctx = cfg.get("max_position_embeddings", 2048)

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
    else:
        sys.exit(f"hf2gguf: model_type {mt!r} not handled (llama, phi)")
    w.add_name(f"synthetic-{os.path.basename(os.path.normpath(src))}")
    w.add_context_length(ctx)
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    add_tokenizer(w, src, cfg, NV)

    names = gguf.get_tensor_name_map(arch, L)
    plan = []  # (gguf name, source name, shape, numpy dtype)
    def order(n):  # embedding, layers in order, then the rest
        parts = n.split(".")
        i = next((int(p) for p in parts if p.isdigit()), None)
        return (0 if "embed" in n else 1 if i is not None else 2, i or 0, n)

    for name in sorted(index, key=order):
        g = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if g is None:
            sys.exit(f"hf2gguf: no GGUF name for {name}")
        shape = index[name][1]["shape"]
        plan.append((g, name, shape, np.float16 if len(shape) >= 2 else np.float32))
    if mt == "llama" and cfg.get("tie_word_embeddings") and "lm_head.weight" in index:
        plan = [p for p in plan if p[1] != "lm_head.weight"]  # llama.cpp ties on a missing output

    for g, name, shape, dt in plan:
        w.add_tensor_info(g, shape, np.dtype(dt), int(np.prod(shape)) * np.dtype(dt).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for g, name, shape, dt in plan:
        x = load(index, name)
        if mt == "llama" and name.endswith("self_attn.q_proj.weight"):
            x = permute(x, NH)
        elif mt == "llama" and name.endswith("self_attn.k_proj.weight"):
            x = permute(x, NKV)
        w.write_tensor_data(x.astype(dt))
    w.close()
    print(f"hf2gguf: wrote {out}: {len(plan)} tensors", file=sys.stderr)


if __name__ == "__main__":
    main()

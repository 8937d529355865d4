#!/usr/bin/env python3
"""hf2gguf.py SRC OUT.gguf: an F16 GGUF of a float Hugging Face / MLX checkpoint folder, for llama.cpp.

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
pooler and MLM heads dropped) and `qwen3` (arch qwen3; NEOX rotary, no permutation; a
sentence-transformers folder with last-token pooling, Qwen3-Embedding, gets pooling LAST and
add_eos_token, as llama.cpp's GGUFs of Qwen3-Embedding have).
Image-text families (issue 43's benchmark against llama-mtmd-cli), as llama.cpp's converter
(conversion/gemma.py, conversion/qwenvl.py) writes them: the language model into OUT.gguf and,
with `--mmproj MMPROJ.gguf`, the vision tower and projector into a clip GGUF beside it.
`gemma3` (Gemma3ForConditionalGeneration): arch gemma3, every RMSNorm weight + 1 (Gemma's
`x * (1 + w)` as llama.cpp stores it), the sliding layers from layer_types as the
sliding_window_pattern array, local and global rope bases, the global layers' linear rope factor;
the mmproj is projector type gemma3: SigLIP's patch conv and position table F32 (the converter
forces `.embeddings.` to F32), the rest of the tower F16, mm.input_projection as stored
([vision width, text width]: clip transposes it), mm.soft_emb_norm + 1, the projector scale factor
(pooling side) written when it is not 4. `qwen2_5_vl`: arch qwen2vl with the M-RoPE sections (padded
to 4); the mmproj is projector type qwen2.5vl_merger: the temporal patch conv [out, C, 2, p, p]
split into two 2-D kernels (v.patch_embd.weight and v.patch_embd.weight.1, as llama.cpp reads it),
each block's fused qkv split into q, k and v, the window-attention pattern from
fullatt_block_indexes (evenly spaced, as llama.cpp requires), SiLU, the text's rms_norm_eps.
llama.cpp's clip uses a 112-pixel attention window for Qwen2.5-VL whatever the config says, so a
window_size other than 112 is refused. Tensor names of transformers 4 (`language_model.model.`)
and 5 (`model.language_model.`, `model.vision_tower.`, `model.visual.`) both convert.
Without torch or transformers: numpy plus the gguf-py that ships inside the llama.cpp source
(PYTHONPATH=LLAMA_SRC/gguf-py), so it writes what that llama.cpp reads.

`--outtype q4_0` writes every matrix as Q4_0 instead, the bytes `llama-quantize --pure` makes
of the F16 output (the values rounded to F16, then ggml's reference Q4_0 as gguf-py has it),
without the F16 file: a 7B twin needs no 15 GB intermediate. The mmproj stays F16/F32.
Matrices (expert stacks included) are written as F16, vectors (norms, biases, sinks) and BERT's
position and token-type tables as F32 (as llama.cpp's converter does), one
tensor at a time (memory stays at one tensor: one expert stack for the MoE families). The
tokenizer is the folder's tokenizer.json (BPE, ByteLevel), padded to vocab_size with `[PAD<id>]`
tokens, pre-tokenizer gpt-2; llama-bench feeds token ids, so only its shape matters.
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


Q4_0 = "q4_0"  # a plan dtype: Q4_0 blocks of the F16-rounded values


def q4_0(x):
    """x [..., n] (n % 32 == 0) as Q4_0 bytes [..., n / 32 * 18]: the values rounded to F16 first,
    then gguf-py's reference Q4_0 (ggml's quantize_row_q4_0_ref), so the bytes are those
    llama-quantize --pure Q4_0 makes of the F16 GGUF; a few thousand rows at a time (memory)."""
    rows = x.reshape(-1, x.shape[-1])
    out = np.empty((rows.shape[0], rows.shape[1] // 32 * 18), np.uint8)
    for r in range(0, rows.shape[0], 4096):
        part = rows[r:r + 4096].astype(np.float16).astype(np.float32)
        out[r:r + 4096] = gguf.quants.quantize(part, gguf.GGMLQuantizationType.Q4_0)
    return out.reshape(*x.shape[:-1], -1)


def write_plan(w, plan):
    for g, shape, dt, _ in plan:
        if dt == Q4_0:
            nb = int(np.prod(shape[:-1])) * shape[-1] // 32 * 18
            w.add_tensor_info(g, list(shape[:-1]) + [shape[-1] // 32 * 18], np.dtype(np.uint8), nb,
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


def main():
    args = sys.argv[1:]
    mmproj, outtype = None, "f16"
    while len(args) > 2 and len(args) % 2 == 0 and args[2] in ("--mmproj", "--outtype"):
        if args[2] == "--mmproj":
            mmproj = args[3]
        else:
            outtype = args[3]
        args = args[:2] + args[4:]
    if len(args) != 2 or outtype not in ("f16", Q4_0):
        sys.exit("usage: hf2gguf.py SRC_FOLDER OUT.gguf [--mmproj MMPROJ.gguf] [--outtype f16|q4_0]")
    src, out = args
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
        sys.exit(f"hf2gguf: model_type {mt!r} not handled (llama, phi, bert, qwen3, qwen3_moe, gpt_oss, gemma3, "
                 "qwen2_5_vl)")
    moe = mt in ("qwen3_moe", "gpt_oss")
    w.add_name(f"synthetic-{os.path.basename(os.path.normpath(src))}")
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
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0 if outtype == Q4_0 else gguf.LlamaFileType.MOSTLY_F16)
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
    if outtype == Q4_0:  # as llama-quantize --pure Q4_0: every matrix (F16 in the F16 output)
        for i, (g, shape, dt, get) in enumerate(plan):
            if dt == np.float16:
                if shape[-1] % 32:
                    sys.exit(f"hf2gguf: {g} {shape}: Q4_0 needs rows of a multiple of 32")
                plan[i] = (g, shape, Q4_0, get)
    write_plan(w, [(g, shape, dt, fix(g, get)) for g, shape, dt, get in plan])
    print(f"hf2gguf: wrote {out}: {len(plan)} tensors", file=sys.stderr)


if __name__ == "__main__":
    main()

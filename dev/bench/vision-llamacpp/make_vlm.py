#!/usr/bin/env python3
"""make_vlm.py: the image-text configs and side files of dev/bench/vision-llamacpp/run.sh.

`mlxcel synth` writes the checkpoint from the config (the language model, and the vision tower
and projector in transformers 5's layout, float under -q); this script writes the config of
each shape and what a checkpoint carries besides its weights: the image processor's configs and
the tokenizer (for Gemma 3, its image tokens added at their ids).

  make_vlm.py configs SHAPE OUTDIR         OUTDIR/config.json (the wrapper, text_config nested)
  make_vlm.py extras CONFIG DIR TOKDIR     DIR's tokenizer files from TOKDIR (Gemma 3: its image
                                           tokens added), preprocessor_config.json,
                                           processor_config.json
  make_vlm.py image W H OUT.png            a deterministic RGB picture (gradients, rings, edges)
  make_vlm.py prompt-ids CONFIG TEXT_IDS SIDE  the prompt ids mlxcel takes for one SIDE x SIDE
                                           image then the text (the image run expanded for Qwen)
  make_vlm.py compare MLXCEL.safetensors LLAMA.bin  the engines' image embeddings agree (exit 0)
  make_vlm.py summary RUNS.jsonl           the markdown table of the runs

Shapes (the published config.json values):
  gemma3-4b      google/gemma-3-4b-it: text 34 x 2560 (8 heads of 256, 4 KV heads, FFN 10240,
                 vocab 262208, sliding window 1024 on 5 of 6 layers, rope 1e6 with linear
                 factor 8 on the global layers, 10000 on the local ones); SigLIP 27 x 1152
                 (16 heads, FFN 4304) at 896 px in 14 px patches, pooled to 256 tokens
                 (mm_tokens_per_image); image tokens boi 255999, eoi 256000, soft 262144.
  qwen2.5-vl-7b  Qwen/Qwen2.5-VL-7B-Instruct: text 28 x 3584 (28 heads of 128, 4 KV heads,
                 FFN 18944, vocab 152064, rope 1e6, mrope_section [16, 24, 24], untied head);
                 ViT 32 x 1280 (16 heads, SwiGLU 3420, RMSNorm, patch 14, temporal patch 2,
                 window 112 px with full attention in blocks 7, 15, 23, 31), merger 5120 ->
                 3584; vision_start 151652, vision_end 151653, image_pad 151655.
  gemma3-small, qwen2.5-vl-small  the same families at a few MB (check runs): the same patch,
                 window and pooling geometry, narrow and shallow.
"""
import json
import os
import shutil
import struct
import sys
import zlib

import numpy as np


def gemma3(small):
    t = {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
         "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256,
         "vocab_size": 262208, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "sliding_window": 1024,
         "sliding_window_pattern": 6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
         "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "hidden_activation": "gelu_pytorch_tanh",
         "final_logit_softcapping": None, "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1,
         "pad_token_id": 0, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
    v = {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
         "num_hidden_layers": 27, "num_attention_heads": 16, "image_size": 896, "patch_size": 14,
         "num_channels": 3, "layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh", "vision_use_head": False}
    if small:
        t.update(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32, max_position_embeddings=4096,
                 sliding_window=512, sliding_window_pattern=2)
        v.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=224)
    w = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "boi_token_index": 255999,
         "eoi_token_index": 256000, "image_token_index": 262144, "mm_tokens_per_image": 256 if not small else 16,
         "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "tie_word_embeddings": True,
         "torch_dtype": "bfloat16", "vision_config": v}
    return t, w


def qwen25vl(small):
    t = {"model_type": "qwen2_5_vl_text", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
         "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
         "max_position_embeddings": 128000, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
         "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "hidden_act": "silu",
         "bos_token_id": 151643, "eos_token_id": 151645, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    v = {"model_type": "qwen2_5_vl", "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
         "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
         "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
         "hidden_act": "silu", "in_chans": 3, "in_channels": 3}
    if small:
        t.update(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=8192,
                 rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]})
        v.update(depth=4, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128,
                 fullatt_block_indexes=[1, 3])
    w = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
         "vision_start_token_id": 151652, "vision_end_token_id": 151653, "vision_token_id": 151654,
         "image_token_id": 151655, "video_token_id": 151656, "bos_token_id": 151643, "eos_token_id": 151645,
         "tie_word_embeddings": t["tie_word_embeddings"], "torch_dtype": "bfloat16", "vision_config": v}
    return t, w


SHAPES = {"gemma3-4b": lambda: gemma3(False), "gemma3-small": lambda: gemma3(True),
          "qwen2.5-vl-7b": lambda: qwen25vl(False), "qwen2.5-vl-small": lambda: qwen25vl(True)}


def gemma_tokenizer(tokdir, d, w):
    """TOKDIR's tokenizer.json with Gemma 3's image tokens added at the wrapper's ids."""
    tok = json.load(open(os.path.join(tokdir, "tokenizer.json")))
    for content, i in (("<start_of_image>", w["boi_token_index"]), ("<end_of_image>", w["eoi_token_index"]),
                       ("<image_soft_token>", w["image_token_index"])):
        tok["added_tokens"].append({"id": i, "content": content, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": True})
    json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w"))
    tc = {"bos_token": None, "eos_token": "<|endoftext|>", "add_bos_token": False}
    json.dump(tc, open(os.path.join(d, "tokenizer_config.json"), "w"))


def cmd_extras(config, d, tokdir):
    w = json.load(open(config))
    v = w["vision_config"]
    if w["model_type"] == "gemma3":
        pp = {"image_processor_type": "Gemma3ImageProcessor", "size": {"height": v["image_size"],
              "width": v["image_size"]}, "resample": 2, "do_resize": True, "do_rescale": True,
              "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
              "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True, "do_pan_and_scan": False}
        proc = {"processor_class": "Gemma3Processor", "image_seq_length": w["mm_tokens_per_image"]}
        gemma_tokenizer(tokdir, d, w)
    else:
        pp = {"image_processor_type": "Qwen2VLImageProcessor", "do_resize": True, "do_rescale": True,
              "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True, "resample": 3,
              "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
              "min_pixels": 3136, "max_pixels": 12845056, "patch_size": v["patch_size"],
              "merge_size": v["spatial_merge_size"], "temporal_patch_size": v["temporal_patch_size"]}
        proc = {"processor_class": "Qwen2_5_VLProcessor", "image_processor": pp}
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(os.path.join(tokdir, f), os.path.join(d, f))
    json.dump(pp, open(os.path.join(d, "preprocessor_config.json"), "w"), indent=1)
    json.dump(proc, open(os.path.join(d, "processor_config.json"), "w"), indent=1)


def cmd_image(wd, ht, out):
    y, x = np.mgrid[0:ht, 0:wd].astype(np.float64)
    u, v = x / wd, y / ht
    ring = 0.5 + 0.5 * np.sin(40 * np.hypot(u - 0.4, v - 0.6))
    box = ((u > 0.6) & (u < 0.85) & (v > 0.15) & (v < 0.4)).astype(np.float64)
    rgb = np.stack([255 * u, 255 * (0.3 * v + 0.7 * ring), 255 * np.maximum(box, 1 - v) * (0.5 + 0.5 * ring)], -1)
    q = np.clip(rgb, 0, 255).astype(np.uint8)
    raw = b"".join(b"\0" + q[r].tobytes() for r in range(ht))
    ch = lambda k, dd: struct.pack(">I", len(dd)) + k + dd + struct.pack(">I", zlib.crc32(k + dd))
    open(out, "wb").write(b"\x89PNG\r\n\x1a\n" + ch(b"IHDR", struct.pack(">IIBBBBB", wd, ht, 8, 2, 0, 0, 0))
                          + ch(b"IDAT", zlib.compress(raw, 6)) + ch(b"IEND", b""))


def cmd_prompt_ids(wrapper, text_ids, side):
    w = json.load(open(wrapper))
    t = [int(i) for i in text_ids.split(",") if i]
    if w["model_type"] == "gemma3":
        ids = [w["boi_token_index"]] + t  # mlxcel expands boi into boi, soft x 256, eoi
    else:
        v = w["vision_config"]
        n = (side // (v["patch_size"] * v["spatial_merge_size"])) ** 2
        ids = [w["vision_start_token_id"]] + [w["image_token_id"]] * n + [w["vision_end_token_id"]] + t
    print(",".join(map(str, ids)))


def read_embeds(spec):
    """mlxcel's --image-embd-out file, or llama.cpp's MTMD_DEBUG_EMBEDDINGS dump (*.bin: int32 rows,
    int32 width, float32 data), as float64 [rows, width]."""
    b = open(spec, "rb").read()
    if spec.endswith(".bin"):
        n, d = struct.unpack("<ii", b[:8])
        return np.frombuffer(b[8:], dtype=np.float32).reshape(n, d).astype(np.float64)
    n = struct.unpack("<Q", b[:8])[0]
    t = json.loads(b[8:8 + n])["image_embeds"]
    a, c = t["data_offsets"]
    return np.frombuffer(b[8 + n + a:8 + n + c], dtype=np.float32).reshape(t["shape"]).astype(np.float64)


def cmd_compare(a_path, b_path):
    """The two engines' image embeddings: shape, max |diff| over max |value|, the least row cosine.
    Exit 1 unless they agree (cosine >= 0.999, max |diff| <= 1e-2 of the largest value)."""
    a, b = read_embeds(a_path), read_embeds(b_path)
    if a.shape != b.shape:
        print(f"image embeddings: shapes differ: mlxcel {a.shape}, llama.cpp {b.shape}")
        sys.exit(1)
    d, s = np.abs(a - b).max(), np.abs(b).max()
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
    ok = cos.min() >= 0.999 and d <= 1e-2 * s
    print(f"image embeddings {a.shape[0]} x {a.shape[1]}: max |diff| {d:.3g} of max |value| {s:.3g} "
          f"({d / s:.2g}), least row cosine {cos.min():.6f}: {'agree' if ok else 'DISAGREE'}")
    sys.exit(0 if ok else 1)


def cmd_summary(path):
    runs = [json.loads(line) for line in open(path) if line.strip()]
    groups = {}
    for r in runs:
        if r.get("ok"):
            groups.setdefault((r["shape"], r["engine"]), []).append(r)
    med = lambda xs: float(np.median(xs)) if xs else float("nan")
    # mlxcel first, then llama.cpp at its default, then its other flash attention settings
    engines = sorted({r["engine"] for r in runs}, key=lambda e: (e != "mlxcel", e != "llama.cpp", e))
    print("| shape | engine | runs | image tokens | encode ms | TTFT ms (encode + prefill + 1st token) "
          "| preprocess ms | load avg (1 min) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    shapes = sorted({k[0] for k in groups})
    for s in shapes:
        for e in engines:
            rs = groups.get((s, e), [])
            if not rs:
                continue
            pre = [r["preprocess_ms"] for r in rs if r.get("preprocess_ms") is not None]
            print(f"| {s} | {e} | {len(rs)} | {rs[0].get('image_tokens', '')} | {med([r['encode_ms'] for r in rs]):.1f} "
                  f"| {med([r['ttft_ms'] for r in rs]):.1f} | {med(pre):.1f} "
                  f"| {med([r['load1_before'] for r in rs]):.2f} |")
        m = groups.get((s, "mlxcel"), [])
        for e in engines:
            l = groups.get((s, e), [])
            if e == "mlxcel" or not m or not l:
                continue
            print(f"| {s} | **{e} / mlxcel** | | | **{med([r['encode_ms'] for r in l]) / med([r['encode_ms'] for r in m]):.2f}x** "
                  f"| **{med([r['ttft_ms'] for r in l]) / med([r['ttft_ms'] for r in m]):.2f}x** | | |")
    for s in shapes:  # both engines must have seen the same prompt
        seen = {(r["engine"], r.get("image_tokens"), r.get("prompt_tokens")) for r in runs if r.get("ok") and r["shape"] == s}
        if len({(t, p) for _, t, p in seen}) > 1:
            print(f"\n**{s}: the engines' image / prompt token counts differ: {sorted(seen)}**")
    where = {}  # what ran where, when it was read (mlxcel's backend, llama.cpp's clip and layers)
    for r in runs:
        if r.get("ok"):
            w = where.setdefault((r["shape"], r["engine"]), set())
            if r.get("backend"):
                w.add(f"backend {r['backend']}")
            if r.get("clip_backend"):
                w.add(f"clip on {r['clip_backend']}")
            if r.get("llama_offloaded"):
                w.add(f"{r['llama_offloaded']} layers on the GPU")
            if r.get("clip_flash_attn"):
                w.add(f"clip flash attention {r['clip_flash_attn']}")
            if r.get("clip_unsupported_ops"):
                w.add("**clip ops its backend lacks (run on the CPU)**")
    if any(where.values()):
        print()
        for (s, e), w in sorted(where.items()):
            if w:
                print(f"- {s}, {e}: {', '.join(sorted(w))}")
    bad = [r for r in runs if not r.get("ok")]
    if bad:
        print(f"\n{len(bad)} failed runs (see runs.jsonl)")


def main():
    a = sys.argv[1:]
    if not a or a[0] in ("-h", "--help"):
        print(__doc__)
        return
    if a[0] == "configs" and len(a) == 3:
        if a[1] not in SHAPES:
            sys.exit(f"make_vlm: shape {a[1]!r}: one of {', '.join(SHAPES)}")
        t, w = SHAPES[a[1]]()
        w["text_config"] = t
        os.makedirs(a[2], exist_ok=True)
        json.dump(w, open(os.path.join(a[2], "config.json"), "w"), indent=1)
    elif a[0] == "extras" and len(a) == 4:
        cmd_extras(a[1], a[2], a[3])
    elif a[0] == "image" and len(a) == 4:
        cmd_image(int(a[1]), int(a[2]), a[3])
    elif a[0] == "prompt-ids" and len(a) == 4:
        cmd_prompt_ids(a[1], a[2], int(a[3]))
    elif a[0] == "compare" and len(a) == 3:
        cmd_compare(a[1], a[2])
    elif a[0] == "summary" and len(a) == 2:
        cmd_summary(a[1])
    else:
        sys.exit("make_vlm: bad arguments (make_vlm.py --help)")


if __name__ == "__main__":
    main()

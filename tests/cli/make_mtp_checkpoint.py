#!/usr/bin/env python3
"""A checkpoint with a multi-token-prediction (MTP) layer for the CLI tests and the benchmark
(--spec mtp, ADR 0108), made at run time from a DeepSeek-V3-layout folder (a golden case:
deepseek_v3, glm4_moe, glm4_moe_lite; or any such checkpoint of float tensors in one
model.safetensors): its files copied, config.json stating num_nextn_predict_layers 1, and
mtp.safetensors holding layer N = num_hidden_layers: the last layer's tensors under N's names
with seeded random values (uniform, norms near 1), enorm, hnorm, eh_proj [d, 2d],
shared_head.norm and shared_head.head [V, d] (in the embeddings' dtype). Such a layer drafts badly: the output with
--spec mtp must still be plain decoding's, whatever its weights.
A Qwen3-Next / Qwen3.5 folder (model_type qwen3_next, qwen3_5_text; ADR 0135) gets the module
under its own names instead: config.json stating mtp_num_hidden_layers 1, mtp.layers.0.* the
last full-attention layer's tensors (random; zero-centred norms near 0), mtp.fc [d, 2d],
mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.norm (the model's lm_head is the head).
Usage: python3 tests/cli/make_mtp_checkpoint.py SRC OUTDIR [SEED]   (stdlib only)
"""
import json, os, random, shutil, struct, sys

src, out = sys.argv[1], sys.argv[2]
rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 45)
os.makedirs(out, exist_ok=True)
for f in os.listdir(src):
    if f.endswith(".json") or f == "model.safetensors":
        if f not in ("golden.json",):
            shutil.copyfile(os.path.join(src, f), os.path.join(out, f))
cfg = json.load(open(os.path.join(src, "config.json")))
N, d, V = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]
qwen = cfg.get("model_type") in ("qwen3_next", "qwen3_5_text")
if qwen:
    cfg["mtp_num_hidden_layers"] = 1
    lt = cfg.get("layer_types") or ["full_attention" if (i + 1) % cfg.get("full_attention_interval", 4) == 0
                                    else "linear_attention" for i in range(N)]
    full = [i for i, t in enumerate(lt) if t == "full_attention"]
    if not full:
        raise SystemExit("no full-attention layer to copy")
else:
    cfg["num_nextn_predict_layers"] = 1
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)

with open(os.path.join(src, "model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))


def bf16(v):
    return struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0])[2:]


def values(dtype, count, norm, scale):
    vals = [(1.0 + 0.2 * (2 * rng.random() - 1)) if norm else scale * (2 * rng.random() - 1) for _ in range(count)]
    if dtype == "F32":
        return struct.pack("<%df" % count, *vals)
    if dtype == "BF16":
        return b"".join(bf16(v) for v in vals)
    if dtype == "F16":
        return struct.pack("<%de" % count, *vals)
    raise SystemExit("unsupported dtype %s" % dtype)


tensors = []  # (name, dtype, shape, bytes)
pre = "model.layers.%d." % (full[-1] if qwen else N - 1)
to = "mtp.layers.0." if qwen else "model.layers.%d." % N
for name, info in sorted(header.items()):
    if not name.startswith(pre):
        continue
    shape, dtype = info["shape"], info["dtype"]
    count = 1
    for s in shape:
        count *= s
    norm = len(shape) == 1 and "norm" in name
    scale = 0.1 if "e_score_correction_bias" in name else 0.2 if qwen and norm else 2.0 / (shape[-1] ** 0.5)
    tensors.append((to + name[len(pre):], dtype, shape, values(dtype, count, norm and not qwen, scale)))
dt = header["model.embed_tokens.weight"]["dtype"]  # the model's float type
for name, shape, norm in (() if not qwen else (("mtp.pre_fc_norm_embedding.weight", [d], True),
                                               ("mtp.pre_fc_norm_hidden.weight", [d], True),
                                               ("mtp.fc.weight", [d, 2 * d], False), ("mtp.norm.weight", [d], True))):
    count = shape[0] * (shape[1] if len(shape) > 1 else 1)
    tensors.append((name, dt, shape, values(dt, count, False, 0.2 if norm else 2.0 / (shape[-1] ** 0.5))))
for suffix, shape, norm in () if qwen else (("enorm.weight", [d], True), ("hnorm.weight", [d], True), ("eh_proj.weight", [d, 2 * d], False),
                            ("shared_head.norm.weight", [d], True), ("shared_head.head.weight", [V, d], False)):
    count = shape[0] * (shape[1] if len(shape) > 1 else 1)
    tensors.append(("model.layers.%d.%s" % (N, suffix), dt, shape, values(dt, count, norm, 2.0 / (shape[-1] ** 0.5))))

hdr, off = {"__metadata__": {"format": "pt"}}, 0
for name, dtype, shape, data in tensors:
    hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
    off += len(data)
js = json.dumps(hdr).encode()
js += b" " * ((8 - len(js) % 8) % 8)
with open(os.path.join(out, "mtp.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(js)))
    f.write(js)
    for t in tensors:
        f.write(t[3])

#!/usr/bin/env python3
"""A Qwen3-Reranker converted to Qwen3ForSequenceClassification (ADR 0136), as vLLM's
examples/pooling/score/convert_model_to_seq_cls.py does it ("from_2_way_softmax": the score
head's one row is the LM head's "yes" row less its "no" row, so that sigmoid(score . h) is the
original's softmax(no, yes)[1]): SRC's files copied (tokenizer, weights), config.json naming
Qwen3ForSequenceClassification with one label, score.safetensors holding score.weight [1, d]
in float32. SRC's LM head is its tied embeddings (the tiny qwen3_rr golden) or lm_head.weight.
Usage: python3 tests/cli/make_seqcls_checkpoint.py SRC OUTDIR   (stdlib only)
"""
import json, os, shutil, struct, sys

src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
for f in os.listdir(src):
    if (f.endswith(".json") and f != "embed.json") or f == "model.safetensors":
        shutil.copyfile(os.path.join(src, f), os.path.join(out, f))
cfg = json.load(open(os.path.join(src, "config.json")))
cfg["architectures"] = ["Qwen3ForSequenceClassification"]
cfg["id2label"], cfg["label2id"] = {"0": "LABEL_0"}, {"LABEL_0": 0}
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
tj = json.load(open(os.path.join(src, "tokenizer.json")))
vocab = dict(tj["model"]["vocab"])
vocab.update({t["content"]: t["id"] for t in tj.get("added_tokens", [])})
yes, no = vocab["yes"], vocab["no"]

with open(os.path.join(src, "model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    base = 8 + n
    name = "lm_head.weight" if "lm_head.weight" in header else "model.embed_tokens.weight"
    info = header[name]
    d = info["shape"][1]
    size = {"F32": 4, "BF16": 2, "F16": 2}[info["dtype"]]

    def row(r):
        f.seek(base + info["data_offsets"][0] + r * d * size)
        raw = f.read(d * size)
        if info["dtype"] == "F32":
            return struct.unpack("<%df" % d, raw)
        if info["dtype"] == "F16":
            return struct.unpack("<%de" % d, raw)
        return [struct.unpack("<f", b"\0\0" + raw[2 * i:2 * i + 2])[0] for i in range(d)]

    score = [a - b for a, b in zip(row(yes), row(no))]
data = struct.pack("<%df" % d, *score)
hdr = json.dumps({"__metadata__": {"format": "pt"},
                  "score.weight": {"dtype": "F32", "shape": [1, d], "data_offsets": [0, len(data)]}}).encode()
hdr += b" " * ((8 - len(hdr) % 8) % 8)
with open(os.path.join(out, "score.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(hdr)) + hdr + data)

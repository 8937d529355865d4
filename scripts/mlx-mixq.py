#!/usr/bin/env python3
"""mlx-mixq.py REST EXPERTS OUT: an MLX checkpoint whose MoE experts come from one quantized folder
and every other tensor from another, as the mlx-community gpt-oss uploads are laid out.

scripts/bench-vs-llamacpp.sh makes gpt-oss's MLX width with it: `mlxcel convert -q` quantizes
every module alike, so REST is the 8-bit g64 affine conversion and EXPERTS the mxfp4 one of the
same float folder; OUT takes the stacked expert tensors (`.mlp.experts.` in the name) of EXPERTS
and the rest of REST, and its config's "quantization" (and "quantization_config") is EXPERTS'
(mode mxfp4, group 32, 4 bits) with one per-module entry (group 64, 8 bits, affine) for each
module quantized in REST, the router keeping REST's own entry. Tensors are copied byte for byte
into one safetensors file per source shard; the standard library only, memory stays at one
chunk.
"""
import json
import os
import shutil
import struct
import sys


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    return hdr, 8 + n


def tensors(folder):
    out = {}
    for fn in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
        path = os.path.join(folder, fn)
        hdr, base = header(path)
        hdr.pop("__metadata__", None)
        for name, h in hdr.items():
            out[name] = (path, h, base)
    if not out:
        sys.exit(f"mlx-mixq: no *.safetensors in {folder}")
    return out


def is_expert(name):
    return ".mlp.experts." in name


def write(path, items):
    """items: [(name, (src path, header entry, base))] -> one safetensors file."""
    hdr, off = {}, 0
    for name, (_, h, _) in items:
        a, b = h["data_offsets"]
        hdr[name] = {"dtype": h["dtype"], "shape": h["shape"], "data_offsets": [off, off + b - a]}
        off += b - a
    hdr["__metadata__"] = {"format": "mlx"}
    raw = json.dumps(hdr, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(raw)))
        out.write(raw)
        for name, (src, h, base) in items:
            a, b = h["data_offsets"]
            with open(src, "rb") as f:
                f.seek(base + a)
                left = b - a
                while left:
                    chunk = f.read(min(left, 64 << 20))
                    if not chunk:
                        sys.exit(f"mlx-mixq: {src} is short")
                    out.write(chunk)
                    left -= len(chunk)


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: mlx-mixq.py REST_FOLDER EXPERTS_FOLDER OUT_FOLDER")
    rest_dir, exp_dir, out_dir = sys.argv[1:]
    rest, exp = tensors(rest_dir), tensors(exp_dir)
    with open(os.path.join(rest_dir, "config.json")) as f:
        rcfg = json.load(f)
    with open(os.path.join(exp_dir, "config.json")) as f:
        ecfg = json.load(f)
    rq, eq = rcfg.get("quantization") or {}, ecfg.get("quantization") or {}
    if not rq or not eq:
        sys.exit("mlx-mixq: both folders must be quantized")
    picked = {n: v for n, v in rest.items() if not is_expert(n)}
    picked.update({n: v for n, v in exp.items() if is_expert(n)})
    if not any(is_expert(n) for n in picked):
        sys.exit(f"mlx-mixq: no expert tensors in {exp_dir}")

    q = {k: v for k, v in eq.items() if not isinstance(v, dict)}
    for n in sorted(picked):
        if n.endswith(".scales") and not is_expert(n):
            mod = n[: -len(".scales")]
            own = rq.get(mod)
            q[mod] = own if isinstance(own, dict) else {
                "group_size": rq["group_size"], "bits": rq["bits"], "mode": rq.get("mode", "affine")}
    cfg = dict(ecfg)
    cfg["quantization"] = q
    cfg["quantization_config"] = q

    os.makedirs(out_dir, exist_ok=True)
    for fn in os.listdir(rest_dir):
        if not fn.endswith(".safetensors") and fn not in ("config.json", "model.safetensors.index.json"):
            src = os.path.join(rest_dir, fn)
            if os.path.isfile(src):
                shutil.copy(src, os.path.join(out_dir, fn))
    # shard by the source files of REST (experts follow their layer's shard)
    shards = {}
    for n, v in picked.items():
        key = os.path.basename(rest[n][0]) if n in rest and not is_expert(n) else None
        if key is None:
            layer = n.split(".")[2] if n.startswith("model.layers.") else None
            like = next((m for m in rest if layer is not None and m.startswith(f"model.layers.{layer}.")), None)
            key = os.path.basename(rest[like][0]) if like else "model.safetensors"
        shards.setdefault(key, []).append((n, v))
    wmap, total = {}, 0
    for fn, items in sorted(shards.items()):
        items.sort()
        write(os.path.join(out_dir, fn), items)
        for n, (_, h, _) in items:
            wmap[n] = fn
            total += h["data_offsets"][1] - h["data_offsets"][0]
    if len(shards) > 1:
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wmap.items()))}, f, indent=1)
    with open(os.path.join(out_dir, "config.json"), "w") as f:  # last: marks the folder complete
        json.dump(cfg, f, indent=4)
    print(f"mlx-mixq: wrote {out_dir}: {len(picked)} tensors, {len(shards)} file(s), {total} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()

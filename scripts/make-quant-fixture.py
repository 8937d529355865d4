#!/usr/bin/env python3
"""make-quant-fixture.py: expected bytes for the C quantizer (tests/test_quantize.c).

Writes tests/fixtures/quant/affine/quant.safetensors with the bit-exact NumPy
reference ../shared/tools/mlxq.py (needs python3-numpy; CI never runs this,
it only reads the committed file; commit it with `scripts/fixtures.sh pack
tests/fixtures/quant/affine`, which writes affine.tar.xz):

  in.F32 / in.F16 / in.BF16        the input rows [8, 256] in each dtype
  affine.<var>.<dt>.b<B>.g<G>.{weight,scales,biases}
                                   var gpu|cpu, dt F32|F16|BF16,
                                   B in 2 3 4 5 6 8, G in 32 64 128
  <mode>.<dt>.{weight,scales}      mode mxfp4|mxfp8|nvfp4

The rows are adversarial: LLM-like normals, all-negative, all-positive,
constant and zero groups, rows built so that (w - bias) / scale lands exactly
on .5 (far edge at the max and at the min), FP4 grid ties, tiny (f16
subnormal) and large (near the f16 limit) values.

Usage: /usr/bin/python3 scripts/make-quant-fixture.py [path/to/mlxq.py] [OUT]
"""
import importlib.util
import json
import os
import struct
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLXQ = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared", "tools", "mlxq.py")
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "tests", "fixtures", "quant",
                                                        "affine", "quant.safetensors")

spec = importlib.util.spec_from_file_location("mlxq", MLXQ)
mlxq = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mlxq)

ROWS, COLS = 8, 256


def tie_row(rng, n_codes, step, negate):
    """Values k*step (+ step/2 on odd positions) with 0 and n_codes*step in every
    32-block, so the snapped scale is exactly +-step and odd positions tie."""
    k = rng.integers(0, n_codes, size=COLS).astype(np.float64)
    v = k * step + (np.arange(COLS) % 2) * step / 2
    v[0::32] = 0.0
    v[1::32] = n_codes * step
    return -v if negate else v


def inputs():
    rng = np.random.default_rng(20261129)
    r = np.zeros((ROWS, COLS), np.float64)
    r[0] = rng.normal(0, 0.02, COLS)                          # LLM-like
    r[1, :128] = -np.abs(rng.normal(0, 1, 128)) - 0.01        # all negative
    r[1, 128:] = np.abs(rng.normal(0, 1, 128)) + 0.5          # all positive
    r[2, :64] = -0.75                                         # constant
    r[2, 64:128] = 0.0                                        # zeros
    r[2, 128:] = rng.normal(0, 1, 128)
    r[2, 160:192] = 1.5                                       # positive constant
    r[3] = tie_row(rng, 3, 0.25, False)                       # 2-bit ties, max far
    r[4] = tie_row(rng, 15, 0.125, True)                      # 4-bit ties, min far
    r[5] = tie_row(rng, 63, 2.0 ** -6, False)                 # 6-bit ties
    # FP4 grid values and their midpoints times powers of two, 6 in most groups
    grid = np.array([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6])
    v = grid[rng.integers(0, len(grid), COLS)] * np.where(rng.random(COLS) < 0.5, -1, 1)
    v[0::16] = 6.0
    r[6] = v * 2.0 ** rng.integers(-3, 4, COLS // 16).repeat(16)
    # tiny and large magnitudes (still finite in f16)
    r[7, :128] = rng.normal(0, 1, 128) * 1e-6
    r[7, 128:] = rng.normal(0, 1, 128) * 2e4
    r[7, 200] = -6.0e4
    return r.astype(np.float32)


DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def storage(x32, dt):
    if dt == "BF16":
        return mlxq.f32_to_bf16_bits(x32)
    if dt == "F16":
        return x32.astype(np.float16)
    return x32


def st_dtype(a, dt):
    if a.dtype == np.uint32:
        return "U32"
    if a.dtype == np.uint8:
        return "U8"
    return dt


def write_safetensors(path, tensors):
    names = sorted(tensors)
    header, off, blobs = {}, 0, []
    for n in names:
        dt, a = tensors[n]
        b = np.ascontiguousarray(a).tobytes()
        header[n] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    header["__metadata__"] = {"format": "mlx"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    x32 = inputs()
    t = {}
    for dt, sname in DTYPES.items():
        w = storage(x32, dt)
        t[f"in.{dt}"] = (dt, w)
        for var in ("gpu", "cpu"):
            for bits in mlxq.AFFINE_BITS:
                for gs in mlxq.AFFINE_GROUP_SIZES:
                    wq, s, b = mlxq.quantize(w, gs, bits, dtype=sname, backend=var)
                    p = f"affine.{var}.{dt}.b{bits}.g{gs}"
                    t[p + ".weight"] = ("U32", wq)
                    t[p + ".scales"] = (dt, s)
                    t[p + ".biases"] = (dt, b)
        for mode in ("mxfp4", "mxfp8", "nvfp4"):
            wq, s, _ = mlxq.quantize(w, mode=mode, dtype=sname)
            t[f"{mode}.{dt}.weight"] = ("U32", wq)
            t[f"{mode}.{dt}.scales"] = ("U8", s)
    write_safetensors(OUT, t)
    print(f"{OUT}: {len(t)} tensors, {os.path.getsize(OUT)} bytes")


if __name__ == "__main__":
    main()

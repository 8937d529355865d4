#!/usr/bin/env python3
"""cmpgguf.py A.gguf B.gguf: exit 0 when both files hold the same tensors (names, types, shapes
and bytes); lists the ones that differ. Metadata is not compared."""
import sys

import gguf

a, b = gguf.GGUFReader(sys.argv[1]), gguf.GGUFReader(sys.argv[2])
ta = {t.name: t for t in a.tensors}; tb = {t.name: t for t in b.tensors}
bad = 0
if set(ta) != set(tb):
    print("names differ", set(ta) ^ set(tb)); bad += 1
for n in ta:
    if n not in tb: continue
    x, y = ta[n], tb[n]
    if x.tensor_type != y.tensor_type or list(x.shape) != list(y.shape) or x.data.tobytes() != y.data.tobytes():
        print("differs:", n, x.tensor_type.name, y.tensor_type.name, list(x.shape), list(y.shape)); bad += 1
print(f"{len(ta)} tensors, {bad} differ")
sys.exit(1 if bad else 0)

#!/usr/bin/env python3
"""cmpgguf.py A.gguf B.gguf: exit 0 when both files hold the same tensors (names, types, shapes
and bytes); lists the ones that differ. Shapes compare as ggml sees them (trailing dimensions
of 1 dropped: llama-quantize writes [128, 1] as [128]). Metadata is not compared."""
import sys

import gguf


def ne(t):
    s = [int(x) for x in t.shape]
    while len(s) > 1 and s[-1] == 1:
        s.pop()
    return s


def main():
    a, b = gguf.GGUFReader(sys.argv[1]), gguf.GGUFReader(sys.argv[2])
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    bad = 0
    if set(ta) != set(tb):
        print("names differ:", sorted(set(ta) ^ set(tb)))
        bad += 1
    for n in sorted(set(ta) & set(tb)):
        x, y = ta[n], tb[n]
        if x.tensor_type != y.tensor_type or ne(x) != ne(y) or x.data.tobytes() != y.data.tobytes():
            print("differs:", n, x.tensor_type.name, y.tensor_type.name, ne(x), ne(y))
            bad += 1
    print(f"{len(ta)} tensors, {bad} differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

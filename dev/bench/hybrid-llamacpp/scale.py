"""scale.py DIR F: multiply every tensor of 2+ dimensions of DIR/model.safetensors (bf16) by F in
place (F a power of two: exact in bf16), so a random checkpoint's layers move its logits."""
import json, struct, sys
import numpy as np
path, f = sys.argv[1] + "/model.safetensors", float(sys.argv[2])
with open(path, "r+b") as fh:
    n = struct.unpack("<Q", fh.read(8))[0]
    hdr = json.loads(fh.read(n))
    for name, h in hdr.items():
        if name == "__metadata__" or len(h["shape"]) < 2:
            continue
        assert h["dtype"] == "BF16", name
        a, b = h["data_offsets"]
        fh.seek(8 + n + a)
        raw = np.frombuffer(fh.read(b - a), dtype=np.uint16)
        x = (raw.astype(np.uint32) << 16).view(np.float32) * f
        fh.seek(8 + n + a)
        fh.write((x.view(np.uint32) >> 16).astype(np.uint16).tobytes())

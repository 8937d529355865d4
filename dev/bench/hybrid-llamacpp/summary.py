#!/usr/bin/env python3
"""summary.py RUNS.jsonl DEPTH: the markdown tables of run.sh's runs.jsonl.

Per shape and test, each engine's median over its processes of their mean tokens/s (mlxcel ran
twice per round, around llama.cpp); decode at DEPTH over decode at depth 0 per engine; memory
per sequence at DEPTH (mlxcel's kv_bytes, llama.cpp's KV + RS buffers), weights and peak RSS;
the load average range and the wall time of every step.
"""
import json
import statistics
import sys

SHAPES = {"granite-h-tiny": "Granite-4.0-H-Tiny", "qwen3-next": "Qwen3-Next (24 layers, 64 experts)",
          "llama-1b": "Llama-3.2-1B", "llama-8b": "Llama-3.1-8B",
          "qwen3-30b-a3b": "Qwen3-30B-A3B (12 of 48 layers)"}
FORMATS = {"q8": "8-bit (MLX g64 / Q8_0)", "bf16": "bf16 / F16"}


def label(s):
    """run.sh's shape label: SHAPE (4-bit) or SHAPE@FORMAT."""
    base, _, q = s.partition("@")
    return SHAPES.get(base, base) + (f" {FORMATS.get(q, q)}" if q else "")


def med(xs):
    return statistics.median(xs) if xs else None


def fmt(x, nd=1):
    return "-" if x is None else f"{x:,.{nd}f}"


def main():
    runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    depth = int(sys.argv[2])
    ts = {}  # (shape, engine, test) -> [t/s]
    mem = {}  # (shape, engine) -> the deep run's record
    for r in runs:
        for t in r.get("tests", []):
            ts.setdefault((r["shape"], r["engine"], t["test"]), []).append(t["ts"])
        if r["engine"] != "setup" and r["test"] == f"d{depth}" and r["rc"] == 0:
            mem[(r["shape"], r["engine"])] = r
    shapes = list(dict.fromkeys(r["shape"] for r in runs if r["engine"] != "setup"))
    pp = sorted({k[2] for k in ts if k[2].startswith("pp")})
    one = [k for k in ts if "x" not in k[2]]  # one sequence; "tgNxS": S sequences together
    tg0 = sorted({k[2] for k in one if k[2].startswith("tg") and "@" not in k[2]})
    tgd = sorted({k[2] for k in one if k[2].startswith("tg") and k[2].endswith(f"@ d{depth}")})
    bat = sorted({k[2] for k in ts if "x" in k[2]}, key=lambda t: int(t.split("x")[1].split()[0]))

    print("| model | engine | " + " | ".join(f"{t} t/s" for t in pp + tg0 + tgd) + f" | d{depth} / d0 |")
    print("|---|---|" + "---:|" * (len(pp + tg0 + tgd) + 1))
    for s in shapes:
        for e in ("mlxcel", "llama.cpp"):
            vals = [med(ts.get((s, e, t), [])) for t in pp + tg0 + tgd]
            a, b = (vals[len(pp)] if tg0 else None), (vals[-1] if tgd else None)
            ratio = fmt(b / a, 2) if a and b else "-"
            print(f"| {label(s)} | {e} | " + " | ".join(fmt(v) for v in vals) + f" | {ratio} |")
    print()
    print("| model | test | mlxcel / llama.cpp |")
    print("|---|---|---:|")
    for s in shapes:
        for t in pp + tg0 + tgd:
            a, b = med(ts.get((s, "mlxcel", t), [])), med(ts.get((s, "llama.cpp", t), []))
            print(f"| {label(s)} | {t} | {fmt(a / b, 2) if a and b else '-'} |")
    if bat:
        print()
        print("Aggregate decode, S sequences together (tokens/s of all; llama.cpp: llama-batched-bench's S_TG):")
        print()
        print("| model | test | mlxcel | llama.cpp | mlxcel / llama.cpp |")
        print("|---|---|---:|---:|---:|")
        for s in shapes:
            for t in bat:
                a, b = med(ts.get((s, "mlxcel", t), [])), med(ts.get((s, "llama.cpp", t), []))
                print(f"| {label(s)} | {t} | {fmt(a)} | {fmt(b)} | {fmt(a / b, 2) if a and b else '-'} |")
    print()
    print(f"Memory per sequence at depth {depth} (the tg test's context) and peak RSS:")
    print()
    print("| model | mlxcel cache (attention rows + states) | llama.cpp KV + RS buffers | mlxcel weights | llama.cpp file | mlxcel peak RSS | llama.cpp peak RSS |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for s in shapes:
        a, b = mem.get((s, "mlxcel"), {}), mem.get((s, "llama.cpp"), {})
        kv_a = a.get("kv_bytes")
        kv_b = (b.get("kv_mib", 0) + b.get("rs_mib", 0)) if b else None
        print(f"| {label(s)} | {fmt(kv_a / 2**20 if kv_a else None)} MiB ({a.get('kv_type', '?')}, n_ctx {a.get('n_ctx', '?')}) "
              f"| {fmt(kv_b)} MiB ({fmt(b.get('kv_mib'))} + {fmt(b.get('rs_mib'))}, {b.get('kv_cells', '?')} cells) "
              f"| {fmt(a['weight_bytes'] / 2**30 if a.get('weight_bytes') else None, 2)} GiB "
              f"| {fmt(b['model_bytes'] / 2**30 if b.get('model_bytes') else None, 2)} GiB "
              f"| {fmt(a.get('peak_rss_mib'), 0)} MiB | {fmt(b.get('peak_rss_mib'), 0)} MiB |")
    print()
    loads = [float(x) for r in runs if r["engine"] != "setup"
             for x in (r["loadavg_before"].split()[0], r["loadavg_after"].split()[0])]
    if loads:
        print(f"1-minute load average around the runs: {min(loads):.2f}-{max(loads):.2f}.")
        print()
    print("| id | engine | model | test | wall s | load before / after | rc |")
    print("|---|---|---|---|---:|---|---:|")
    for r in runs:
        print(f"| {r['id']} | {r['engine']} | {r['shape']} | {r['test']} | {r['wall_s']:.1f} "
              f"| {r['loadavg_before'].split()[0]} / {r['loadavg_after'].split()[0]} | {r['rc']} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""bench-report.py OUT: results.json, ratios.png and table.md from a scripts/bench-vs-llamacpp.sh run.
bench-report.py --bpt MODEL...: the bytes read per decoded token of MLX folders and GGUF files.

Reads OUT/meta.json (machine, builds, settings), OUT/runs.jsonl (one line per benchmark process:
engine, model, width, phase A1/B/A2, kind, command, times, CPU accounting) with each process's
JSON output in OUT/raw/ID.json, and OUT/raw/membw-{before,after}.txt. Writes:
  results.json  {"meta", "membw", "measurements": one object per test of each run,
                 "comparisons": ratios and targets}
  ratios.png    mlxcel / llama.cpp per model, width and test, and decode's share of bandwidth
  table.md      the markdown for docs/benchmarks.md
Bytes read per decoded token come from the weight files' headers (safetensors; GGUF through the
gguf-py of the llama.cpp source on PYTHONPATH): every tensor, except the embedding when the head is
not tied to it (one row a token), and k/n of each stacked expert tensor (weights, scales, biases:
the selected k of n experts, from num_experts_per_tok and num_local_experts / num_experts, or the
GGUF's expert_used_count and expert_count), so a MoE model's figure is what one decoded token reads.
"""
import json
import os
import re
import struct
import subprocess
import sys

OTHER_CPU_NOISY = 0.10  # cores used by other processes during a run (docs/benchmarks.md, Method)

TARGETS = {  # issue 13
    "pp": ("mlxcel / llama.cpp", 1.2),
    "tg_depth": ("mlxcel / llama.cpp", 1.2),
    "tg_bw": ("share of membw", 0.90),
    "batched": ("x8 / x1", 4.0),
    "phixtral_q4_tg": ("mlxcel / llama.cpp", 1.0),
}


def tally(sizes, is_expert, k_exp, n_exp):
    """Bytes one decoded token reads of the (name, bytes) pairs: k/n of each expert tensor."""
    total = dense = experts = 0.0
    for name, nbytes in sizes:
        if n_exp and k_exp and is_expert(name):
            total += nbytes * k_exp / n_exp
            experts += nbytes
        else:
            total += nbytes
            dense += nbytes
    return {"bytes_per_token": total, "dense_bytes": dense, "expert_bytes_all": experts,
            "experts_used": k_exp, "experts": n_exp}


def safetensors_bpt(folder):
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    n_exp = cfg.get("num_local_experts") or cfg.get("num_experts") or 0
    k_exp = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0
    tensors = {}
    for fn in sorted(os.listdir(folder)):
        if not fn.endswith(".safetensors"):
            continue
        with open(os.path.join(folder, fn), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr = json.loads(f.read(n))
        hdr.pop("__metadata__", None)
        for name, h in hdr.items():
            a, b = h["data_offsets"]
            tensors[name] = (h["shape"], b - a)
    has_head = any(n.startswith("lm_head") for n in tensors)
    sizes = [(n, b) for n, (_, b) in tensors.items()
             if not (has_head and re.search(r"embed_tokens|\bwte\b|\.embd\.", n))]
    return tally(sizes, lambda n: ("switch_mlp" in n or ".experts." in n) and bool(tensors[n][0])
                 and tensors[n][0][0] == n_exp, k_exp, n_exp)


def gguf_bpt(path):
    try:
        import gguf
    except ImportError:
        return None
    r = gguf.GGUFReader(path)

    def kv(suffix):
        for k, f in r.fields.items():
            if k.endswith("." + suffix) and f.data:
                return int(f.parts[f.data[0]][0])
        return 0
    names = {t.name: int(t.n_bytes) for t in r.tensors}
    tied = "output.weight" not in names
    sizes = [(n, b) for n, b in names.items() if tied or n != "token_embd.weight"]
    return tally(sizes, lambda n: "_exps." in n, kv("expert_used_count"), kv("expert_count"))


def print_bpt(paths):
    """--bpt: one line per model: bytes per decoded token and its parts."""
    for p in paths:
        d = safetensors_bpt(p) if os.path.isdir(p) else gguf_bpt(p)
        if d is None:
            sys.exit("bench-report: reading a GGUF needs gguf-py on PYTHONPATH")
        moe = (f"dense + head {d['dense_bytes'] / 1e9:.3f} GB, experts {d['experts_used']} of "
               f"{d['experts']}: {d['expert_bytes_all'] * d['experts_used'] / d['experts'] / 1e9:.3f} GB "
               f"of {d['expert_bytes_all'] / 1e9:.3f} GB") if d["experts"] else "dense"
        print(f"{p}: {d['bytes_per_token'] / 1e9:.3f} GB ({d['bytes_per_token']:.0f} bytes) per decoded token ({moe})")


def membw(path, threads):
    """(mean, best) GB/s of the reading with `threads` threads (or the largest below it)."""
    best = None
    try:
        text = open(path).read()
    except OSError:
        return None
    for m in re.finditer(r"threads\s+(\d+): best\s+([\d.]+) GB/s, mean\s+([\d.]+) GB/s", text):
        t = int(m.group(1))
        if t <= threads and (best is None or t > best[0]):
            best = (t, float(m.group(3)), float(m.group(2)))
    return None if best is None else {"threads": best[0], "mean_gbs": best[1], "best_gbs": best[2]}


def test_name(engine, kind, obj, settings):
    d = settings["depth"]
    if engine == "llamacpp":
        p, n, dep = obj.get("n_prompt", 0), obj.get("n_gen", 0), obj.get("n_depth", 0)
        if n == 0:
            return f"pp{p}" + (f"@d{dep}" if dep else "")
        if p == 0:
            return f"tg{n}" + (f"@d{dep}" if dep else "")
        return f"pp{p}+tg{n}"
    t = obj["test"].split(" @ ")[0]  # mlxcel bench names a depth "tg128 @ d4096", as llama-bench prints it
    if kind == "batched" and t.startswith("pp"):
        return None  # the -p 16 warm-up helper of the batched run
    if kind == "depth" and t.startswith("tg"):
        return f"{t}@d{obj.get('n_depth') or d}"
    return t


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--bpt":
        print_bpt(sys.argv[2:])
        return
    out = sys.argv[1]
    meta = json.load(open(os.path.join(out, "meta.json")))
    try:
        meta["date_end"] = open(os.path.join(out, "raw", "date_end.txt")).read().strip()
    except OSError:
        pass
    st = meta["settings"]
    hz = meta.get("clk_tck", 100)
    bw_before = membw(os.path.join(out, "raw", "membw-before.txt"), st["threads"])
    bw_after = membw(os.path.join(out, "raw", "membw-after.txt"), st["threads"])
    bws = [b["mean_gbs"] for b in (bw_before, bw_after) if b]
    bw = sum(bws) / len(bws) if bws else None

    bpt_cache = {}
    bpt_parts = {}  # model file or folder: bytes per token and its parts (results.json)

    def bpt(engine, files):
        key = (engine, tuple(files))
        if key not in bpt_cache:
            path = os.path.dirname(files[0]) if engine == "mlxcel" else files[0]
            d = safetensors_bpt(path) if engine == "mlxcel" else gguf_bpt(path)
            bpt_parts[path] = d
            bpt_cache[key] = d and d["bytes_per_token"]
        return bpt_cache[key]

    runs = [json.loads(l) for l in open(os.path.join(out, "runs.jsonl")) if l.strip()]
    meas = []
    for r in runs:
        cpu = [float(x) for x in r.get("cpu_s", "").split()] or [0.0]
        own = sum(cpu)
        other = max(0.0, r["busy_jiffies"] / hz - own) / r["wall_s"] if r["wall_s"] > 0 else None
        steal = r["steal_jiffies"] / hz / r["wall_s"] if r["wall_s"] > 0 else None
        base = {k: r[k] for k in ("id", "engine", "model", "width", "phase", "kind", "command", "start",
                                  "end", "loadavg_before", "loadavg_after", "quiet_before", "wall_s")}
        base["other_cpu_cores"] = round(other, 3) if other is not None else None
        base["steal_cores"] = round(steal, 3) if steal is not None else None
        base["noisy"] = other is not None and other > OTHER_CPU_NOISY
        if r["rc"] != 0:
            meas.append(dict(base, test=None, error=f"exit status {r['rc']}"))
            continue
        try:
            data = json.load(open(os.path.join(out, "raw", r["id"] + ".json")))
        except (OSError, ValueError) as e:
            meas.append(dict(base, test=None, error=f"unreadable output: {e}"))
            continue
        for obj in data:
            t = test_name(r["engine"], r["kind"], obj, st)
            if t is None:
                continue
            m = dict(base, test=t)
            if r["engine"] == "mlxcel":
                m.update(ts_mean=obj["ts_mean"], ts_sd=obj["ts_sd"], samples_ts=obj.get("samples_ts"),
                         n_seqs=obj.get("n_seqs", 1), backend=obj.get("backend"), fast=obj.get("fast"),
                         peak_rss_bytes=obj.get("peak_rss_bytes"), weight_bytes=obj.get("weight_bytes"))
            else:
                m.update(ts_mean=obj["avg_ts"], ts_sd=obj["stddev_ts"], samples_ts=obj.get("samples_ts"),
                         n_seqs=1, model_size=obj.get("model_size"), model_type=obj.get("model_type"),
                         flash_attn=obj.get("flash_attn"), type_k=obj.get("type_k"),
                         build_commit=obj.get("build_commit"), cpu_info=obj.get("cpu_info"))
            if re.fullmatch(r"tg\d+", t) and m["n_seqs"] == 1:
                b = bpt(r["engine"], r["files"])
                if b:
                    m["bytes_per_token"] = b
                    m["gbs"] = b * m["ts_mean"] / 1e9
                    if bw:
                        m["bw_share"] = m["gbs"] / bw
            meas.append(m)

    # comparisons: mean of A1 and A2 against B, per model, width, test
    def pick(engine, model, width, test, phase=None):
        return [m for m in meas if m["engine"] == engine and m["model"] == model and m["width"] == width
                and m.get("test") == test and (phase is None or m["phase"] == phase) and "ts_mean" in m]

    def mean(xs):
        return sum(xs) / len(xs) if xs else None

    cells = []
    for m in meas:
        k = (m["model"], m["width"])
        if k not in cells:
            cells.append(k)
    pp, tg, dep = f"pp{st['n_prompt']}", f"tg{st['n_gen']}", f"tg{st['n_gen']}@d{st['depth']}"
    tgs = f"tg{st['n_gen']}x{st['n_seq']}"
    comps = []
    for model, width in cells:
        for test, tkey in ((tg, "tg"), (pp, "pp"), (dep, "tg_depth")):
            a1 = pick("mlxcel", model, width, test, "A1")
            a2 = pick("mlxcel", model, width, test, "A2")
            b = pick("llamacpp", model, width, test, "B")
            a = mean([x["ts_mean"] for x in a1 + a2])
            bb = mean([x["ts_mean"] for x in b])
            c = {"model": model, "width": width, "test": test,
                 "mlxcel_A1": a1[0]["ts_mean"] if a1 else None, "mlxcel_A2": a2[0]["ts_mean"] if a2 else None,
                 "mlxcel": a, "llamacpp": bb, "ratio": a / bb if a and bb else None,
                 "drift_A2_over_A1": a2[0]["ts_mean"] / a1[0]["ts_mean"] if a1 and a2 else None,
                 "noisy": any(x["noisy"] for x in a1 + a2 + b)}
            if tkey == "tg":
                shares = [x["bw_share"] for x in a1 + a2 if "bw_share" in x]
                c["mlxcel_bw_share"] = mean(shares)
                c["llamacpp_bw_share"] = mean([x["bw_share"] for x in b if "bw_share" in x])
                c["mlxcel_bytes_per_token"] = a1[0].get("bytes_per_token") if a1 else None
                c["llamacpp_bytes_per_token"] = b[0].get("bytes_per_token") if b else None
                if model == "phixtral" and width == "q4":
                    c["target"], c["goal"] = TARGETS["phixtral_q4_tg"]
                    c["met"] = c["ratio"] is not None and c["ratio"] >= c["goal"]
                else:
                    c["target"], c["goal"] = TARGETS["tg_bw"]
                    c["met"] = c["mlxcel_bw_share"] is not None and c["mlxcel_bw_share"] >= c["goal"]
            else:
                c["target"], c["goal"] = TARGETS[tkey]
                c["met"] = c["ratio"] is not None and c["ratio"] >= c["goal"]
            if tkey == "tg_depth" and not a1 and not a2:
                ran = any(r["kind"] == "depth" and r["model"] == model and r["width"] == width for r in runs)
                c["note"] = ("not run" if not ran else "mlxcel bench has no depth option"
                             if not st.get("mlxcel_depth_flag") else "no result")
            comps.append(c)
        one = pick("mlxcel", model, width, tg)
        many = pick("mlxcel", model, width, tgs)
        x1, x8 = mean([x["ts_mean"] for x in one]), mean([x["ts_mean"] for x in many])
        comps.append({"model": model, "width": width, "test": f"{tgs} / {tg}", "mlxcel_x1": x1, "mlxcel_xS": x8,
                      "ratio": x8 / x1 if x1 and x8 else None, "target": TARGETS["batched"][0],
                      "goal": TARGETS["batched"][1], "met": bool(x1 and x8 and x8 / x1 >= TARGETS["batched"][1]),
                      "noisy": any(x["noisy"] for x in one + many)})

    results = {"meta": meta, "membw": {"before": bw_before, "after": bw_after, "mean_gbs": bw},
               "bytes_per_token": bpt_parts, "measurements": meas, "comparisons": comps}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)

    write_chart(out, cells, comps, pp, tg, dep, meta)
    md = table(meta, results, cells, pp, tg, dep, tgs)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(md)


def fmt(x, nd=2):
    return "–" if x is None else f"{x:.{nd}f}"


def cell_ts(ms):
    if not ms:
        return "–"
    m = ms[0]
    s = f"{m['ts_mean']:.2f} ± {m['ts_sd']:.2f}"
    return s + ("*" if m["noisy"] else "")


def table(meta, res, cells, pp, tg, dep, tgs):
    h, ml, lc, st = meta["host"], meta["mlxcel"], meta["llamacpp"], meta["settings"]
    bw = res["membw"]
    meas = res["measurements"]
    L = []
    L.append(f"Machine: {h['model_name']}, `lscpu` family {h['family']} model {h['model']}, {h['cpus']} CPUs"
             f" ({h['flags_simd']}), kernel {h['kernel']}. Date {meta['date_start']} to {meta.get('date_end', '?')}.")
    L.append(f"mlxcel `{ml['commit'][:7]}`{' (src modified)' if ml['dirty'] else ''}; llama.cpp {lc['tag']} "
             f"(node-llama-cpp {lc['node_llama_cpp']}, commit `{lc['commit'][:7]}`), CMake Release, "
             f"{'AVX2 only (GGML_NATIVE=OFF, AVX-512 off; mlxcel MLXCEL_ISA=avx2)' if st.get('isa') == 'avx2' else 'GGML_NATIVE=ON'}. "
             f"{st['threads']} threads, {st['reps']} repetitions{', QUICK CHECK: not a measurement' if st['quick'] else ''}."
             f"{' mlxcel ran with --fast (4-bit products on x rounded to 8 bits per group: not exact).' if st.get('mlxcel_fast') else ''}")
    b0, b1 = bw["before"], bw["after"]
    L.append(f"membw ({st['threads']} threads, anonymous): before {fmt(b0 and b0['mean_gbs'], 1)} GB/s, "
             f"after {fmt(b1 and b1['mean_gbs'], 1)} GB/s (mean of passes).")
    L.append("")
    L.append("| model | width | test | mlxcel A1 t/s | llama.cpp B t/s | mlxcel A2 t/s | mlxcel / llama.cpp | goal | met |")
    L.append("|---|---|---|---:|---:|---:|---:|---|---|")
    comps = {(c["model"], c["width"], c["test"]): c for c in res["comparisons"]}

    def ms(engine, model, width, test, phase):
        return [m for m in meas if m["engine"] == engine and m["model"] == model and m["width"] == width
                and m.get("test") == test and m["phase"] == phase and "ts_mean" in m]

    for model, width in cells:
        lw = {"bf16": "bf16 / F16", "q8": "8-bit g64 / Q8_0", "q4": "4-bit g64 / Q4_0",
              "mxfp4": "mxfp4 experts + 8-bit g64 / MXFP4_MOE"}[width]
        for test in (tg, pp, dep):
            c = comps.get((model, width, test), {})
            goal = f"{c.get('target', '')} ≥ {c.get('goal', '')}" if c.get("goal") else ""
            met = "–" if c.get("ratio") is None and c.get("mlxcel_bw_share") is None else ("yes" if c.get("met") else "no")
            if c.get("target") == TARGETS["tg_bw"][0] and c.get("mlxcel_bw_share") is not None:
                met += f" ({100 * c['mlxcel_bw_share']:.0f} %)"
            note = f" ({c['note']})" if c.get("note") else ""
            L.append(f"| {model} | {lw} | {test} | {cell_ts(ms('mlxcel', model, width, test, 'A1'))}{note} | "
                     f"{cell_ts(ms('llamacpp', model, width, test, 'B'))} | {cell_ts(ms('mlxcel', model, width, test, 'A2'))} | "
                     f"{fmt(c.get('ratio'))} | {goal} | {met} |")
    L.append("")
    L.append(f"Decode {tg}: bytes read per token (weights, from the file headers) × t/s, against membw "
             f"{fmt(bw['mean_gbs'], 1)} GB/s:")
    L.append("")
    L.append("| model | width | mlxcel GB/token | mlxcel GB/s | share | llama.cpp GB/token | llama.cpp GB/s | share |")
    L.append("|---|---|---:|---:|---:|---:|---:|---:|")
    for model, width in cells:
        c = comps.get((model, width, tg), {})
        a = [m for m in meas if m["engine"] == "mlxcel" and m["model"] == model and m["width"] == width and m.get("test") == tg]
        b = [m for m in meas if m["engine"] == "llamacpp" and m["model"] == model and m["width"] == width and m.get("test") == tg]
        ag = sum(m.get("gbs", 0) for m in a) / len(a) if a else None
        bg = sum(m.get("gbs", 0) for m in b) / len(b) if b else None
        pct = lambda x: "–" if x is None else f"{100 * x:.0f} %"
        L.append(f"| {model} | {width} | {fmt(c.get('mlxcel_bytes_per_token') and c['mlxcel_bytes_per_token'] / 1e9, 3)} | "
                 f"{fmt(ag, 1)} | {pct(c.get('mlxcel_bw_share'))} | "
                 f"{fmt(c.get('llamacpp_bytes_per_token') and c['llamacpp_bytes_per_token'] / 1e9, 3)} | {fmt(bg, 1)} | "
                 f"{pct(c.get('llamacpp_bw_share'))} |")
    L.append("")
    moe = [(p, d) for p, d in sorted(res.get("bytes_per_token", {}).items()) if d and d.get("experts")]
    if moe:
        L.append("MoE models: a decoded token reads every dense tensor and the LM head, and of each expert "
                 "stack only the selected experts:")
        L.append("")
        for p, d in moe:
            L.append(f"- `{os.path.basename(os.path.normpath(p))}`: {d['bytes_per_token'] / 1e9:.3f} GB per token = "
                     f"dense + head {d['dense_bytes'] / 1e9:.3f} GB + experts {d['experts_used']} of {d['experts']} "
                     f"({d['expert_bytes_all'] * d['experts_used'] / d['experts'] / 1e9:.3f} of "
                     f"{d['expert_bytes_all'] / 1e9:.3f} GB)")
        L.append("")
    rows = []
    for model, width in cells:
        c = comps.get((model, width, f"{tgs} / {tg}"), {})
        if c.get("mlxcel_xS") is None and not any(m.get("kind") == "batched" and m["model"] == model
                                                   and m["width"] == width for m in meas):
            continue  # not run (the MoE shapes)
        met = "–" if c.get("ratio") is None else ("yes" if c["met"] else "no")
        rows.append(f"| {model} | {width} | {fmt(c.get('mlxcel_x1'))} | {fmt(c.get('mlxcel_xS'))} | {fmt(c.get('ratio'))} | {met} |")
    if rows:
        L.append(f"Batched decode, mlxcel: {st['n_seq']} sequences in one batch against one (aggregate t/s, mean of A1 and A2):")
        L.append("")
        L.append(f"| model | width | {tg} t/s | {tgs} t/s | ratio | goal ≥ 4 |")
        L.append("|---|---|---:|---:|---:|---|")
        L += rows
        L.append("")
    L.append("t/s: mean ± sd over the repetitions of one run; * marks a run during which other processes used "
             f"more than {OTHER_CPU_NOISY:.2f} cores (repeat it). Ratios use the mean of A1 and A2.")
    return "\n".join(L) + "\n"


def write_chart(out, cells, comps, pp, tg, dep, meta):
    c = {(x["model"], x["width"], x["test"]): x for x in comps}
    dat = os.path.join(out, "ratios.dat")
    with open(dat, "w") as f:
        f.write("# label tg pp depth mlxcel_bw llamacpp_bw\n")
        for model, width in cells:
            def v(test, key="ratio"):
                x = c.get((model, width, test), {}).get(key)
                return "-" if x is None else f"{x:.4f}"
            f.write(f'"{model} {width}" {v(tg)} {v(pp)} {v(dep)} {v(tg, "mlxcel_bw_share")} {v(tg, "llamacpp_bw_share")}\n')
    h = meta["host"]
    title = (f"mlxcel {meta['mlxcel']['commit'][:7]} vs llama.cpp {meta['llamacpp']['tag']}, "
             f"{meta['settings']['threads']} threads, family {h['family']} model {h['model']}"
             + (" (quick check)" if meta["settings"]["quick"] else ""))
    gp = f"""set terminal pngcairo size 1200,900 font ",10" noenhanced
set output "{os.path.join(out, 'ratios.png')}"
set datafile missing "-"
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set grid ytics
set xtics rotate by -30
set key top right
set multiplot layout 2,1 title "{title}"
set title "mlxcel / llama.cpp, same weights and bits per weight (goal: pp and depth >= 1.2)"
set ylabel "ratio"
set yrange [0:*]
plot "{dat}" using 2:xtic(1) title "{tg}", "" using 3 title "{pp}", "" using 4 title "{dep}", \\
     1.0 with lines dt 2 lc rgb "black" notitle, 1.2 with lines dt 3 lc rgb "red" notitle
set title "decode {tg}: bytes streamed per second / membw (goal >= 0.9)"
set ylabel "share of bandwidth"
set yrange [0:*]
plot "{dat}" using 5:xtic(1) title "mlxcel", "" using 6 title "llama.cpp", \\
     0.9 with lines dt 3 lc rgb "red" notitle
unset multiplot
"""
    with open(os.path.join(out, "ratios.gp"), "w") as f:
        f.write(gp)
    r = subprocess.run(["gnuplot", os.path.join(out, "ratios.gp")], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench-report: gnuplot failed: {r.stderr.strip()}")


if __name__ == "__main__":
    main()

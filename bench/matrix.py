#!/usr/bin/env python3
"""The portability matrix: kernel x platform efficiency and Pennycook's P from ompk-bench JSON.

usage: matrix.py --run LABEL=BENCH.json[@host|@gpu] ... [--not-run LABEL=WHY ...]
                 [--md OUT.md] [--png OUT.png] [--json OUT.json] [--exact-shapes] [--all-kernels]

Each --run is one platform: the records of one pass (backend host or gpu; default gpu when the
file has GPU records, else host) of one ompk-bench JSON file, e.g.
    --run h100-clang=dev/bench.json@gpu --run xeon-clang=dev/bench.json@host
    --run h100-gcc=gcc/bench.json@gpu --run epyc-clang=epyc.json --run epyc-gcc=epyc-gcc.json
--not-run adds a column that was built but not measured (e.g. amdgpu="built, not run (no AMD
hardware lent)"); it is shown and left out of P, which would otherwise be 0 for every kernel.

Efficiency of a record: against the roofline of its own run, max(achieved GB/s / the copy
bandwidth measured in that pass, achieved TFLOP/s / the FP32 FMA probe of that pass), the
fraction of the time the slower of the two limits allows. Files from before the probe, and bf16
records where the run states a bf16 (matrix-unit) peak, use the stated peak instead (marked *).
An efficiency above 1 (a kernel on matrix units against the FP32 probe, or data held in cache
against the copy bandwidth) is shown as is and counts as 1 in P (marked +).

Rows: kernel x dtype x shape class (the shape with its sizes dropped, e.g. "B H N dh causal");
each platform's cell is the largest shape of that class the portable implementation ran, and
for "best" the largest shape any implementation ran plus the portable one (the shapes are in the
JSON output), or, with --exact-shapes, one row per exact shape. Only the kernels of the library's ops are rows
unless --all-kernels (probes, phases, diagnostics included).

Per row, P is the harmonic mean of the efficiencies over the platforms run (Pennycook et al.),
0 where a kernel has no record on one of them; computed twice: over the portable implementation
alone (records whose impl is "portable"; where a record has no impl, older files and the MoE
entries, its variant label) and over the best record of each platform.
"""
import argparse
import json
import re
import sys
from collections import defaultdict

# the kernels of the library's ops (ompk_bench.c: record_op)
OP_KERNELS = {
    "attention_fwd", "attention_bwd", "attention_decode", "mhc_pre_fwd", "mhc_pre_bwd",
    "mhc_pre_fwd_sinkhorn_bwd", "mhc_sinkhorn_fwd", "mhc_sinkhorn_bwd", "mhc_post_fwd",
    "mhc_post_bwd", "router_topk_fwd", "router_topk_bwd", "moe_fwd", "moe_sft_step",
}
SIZE_TOKEN = re.compile(r"^[A-Za-z]+\d+$")


def pennycook(effs):
    """Harmonic mean of the efficiencies (each capped at 1); 0 if any is missing or 0."""
    if not effs or any(e is None or e <= 0 for e in effs):
        return 0.0
    return len(effs) / sum(1.0 / min(e, 1.0) for e in effs)


def shape_class(shape):
    return " ".join(t for t in (shape or "").split() if not SIZE_TOKEN.match(t)) or "-"


def efficiency(r):
    """(fraction of the record's roofline, roofline note) or (None, None)."""
    ms = r.get("ms")
    if not ms or ms <= 0:
        return None, None
    effs, note = [], ""
    if r.get("gb_per_s") is not None and r.get("copy_gb_per_s"):
        effs.append(r["gb_per_s"] / r["copy_gb_per_s"])
    tf = r.get("tflop_per_s")
    if tf and r.get("flops"):
        probe = r.get("fp32_probe_tflops")
        if r.get("peak") == "bf16" and r.get("pct_of_peak") is not None:
            effs.append(r["pct_of_peak"] / 100.0)
            note = "*"
        elif probe:
            effs.append(tf / probe)
        elif r.get("pct_of_peak") is not None:
            effs.append(r["pct_of_peak"] / 100.0)
            note = "*"
    if not effs:
        return None, None
    e = max(effs)
    return e, note + ("+" if e > 1 else "")


def is_portable(r):
    """What ran, where the record says (impl); else its variant label ("portable", or for the MoE
    entries "portable-<threads>...", which name the ISA path they forced)."""
    if r.get("impl"):
        return r["impl"] == "portable"
    return (r.get("variant") or "").split("-")[0] == "portable"


def load_run(spec):
    label, _, rest = spec.partition("=")
    path, _, backend = rest.partition("@")
    if not label or not path:
        raise SystemExit(f"matrix: --run {spec}: expected LABEL=PATH[@host|@gpu]")
    d = json.load(open(path))
    recs = d.get("records", [])
    if not backend:
        backend = "gpu" if any(r.get("backend") == "gpu" for r in recs) else "host"
    recs = [r for r in recs if r.get("backend") == backend]
    if not recs:
        raise SystemExit(f"matrix: {path} has no {backend} records")
    return {"label": label, "path": path, "backend": backend, "records": recs,
            "machine": {k: d.get(k) for k in ("host", "cpu", "gpu", "compiler", "date",
                                              "offload_archs", "quick")}}


def roofline(run):
    """The run's copy bandwidth and FP32 probe, and the stated FP32 peak when a record shows it."""
    copy = max((r.get("copy_gb_per_s") or 0 for r in run["records"]), default=0)
    probe = max((r.get("fp32_probe_tflops") or 0 for r in run["records"]), default=0)
    stated = None
    for r in run["records"]:
        if r.get("peak") == "fp32" and r.get("pct_of_peak") and r.get("tflop_per_s"):
            stated = r["tflop_per_s"] / (r["pct_of_peak"] / 100.0)
            break
    return {"copy_gb_per_s": copy or None, "fp32_probe_tflops": probe or None,
            "fp32_stated_tflops": stated}


def cell_eff(per, label, kind):
    c = (per.get(label) or {}).get(kind)
    return c["eff"] if c else None


def build(runs, exact=False, all_kernels=False):
    """rows[key][label] = {"portable": cell, "best": cell}; a cell is the best record's data."""
    cells = defaultdict(dict)
    for run in runs:
        by = defaultdict(list)
        for r in run["records"]:
            if not all_kernels and r.get("kernel") not in OP_KERNELS:
                continue
            e, note = efficiency(r)
            if e is None:
                continue
            cls = r.get("shape") if exact else shape_class(r.get("shape"))
            by[(r["kernel"], r.get("dtype"), cls)].append((r, e, note))
        for key, lst in by.items():
            # the largest shape of the class each kind ran (a slow portable kernel may be
            # benchmarked at a smaller shape), then the best record there
            def largest(xs):
                size = max((r.get("bytes") or 0 for r, _, _ in xs), default=0)
                return [x for x in xs if (x[0].get("bytes") or 0) == size]

            def cell(xs):
                if not xs:
                    return None
                r, e, note = max(xs, key=lambda x: x[1])
                return {"eff": e, "note": note, "ms": r.get("ms"), "shape": r.get("shape"),
                        "impl": r.get("impl") or r.get("variant") or "default"}

            port = largest([x for x in lst if is_portable(x[0])])
            cells[key][run["label"]] = {"portable": cell(port), "best": cell(largest(lst) + port)}
    labels = [run["label"] for run in runs]
    rows = []
    for key in sorted(cells, key=lambda k: (k[0], str(k[1]), k[2])):
        per = cells[key]
        rows.append({"kernel": key[0], "dtype": key[1], "shape": key[2], "cells": per,
                     "P_portable": pennycook([cell_eff(per, lb, "portable") for lb in labels]),
                     "P_best": pennycook([cell_eff(per, lb, "best") for lb in labels])})
    return rows


def fmt_cell(c):
    if not c:
        return "-"
    return f"{100 * c['eff']:.1f}%{c['note']}"


def markdown(runs, not_run, rows):
    labels = [run["label"] for run in runs]
    out = ["Efficiency against each platform's roofline measured in the same run "
           "(portable / best, best implementation in brackets); P over "
           + ", ".join(labels) + ".", ""]
    head = ["kernel", "dtype", "shape"] + labels + [lb for lb, _ in not_run] + ["P portable",
                                                                                "P best"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for row in rows:
        cols = [row["kernel"], str(row["dtype"]), row["shape"]]
        for lb in labels:
            c = row["cells"].get(lb)
            if not c:
                cols.append("not measured")
                continue
            best = c["best"]
            cols.append(f"{fmt_cell(c['portable'])} / {fmt_cell(best)}"
                        + (f" ({best['impl']})" if best else ""))
        cols += [why for _, why in not_run]
        cols += [f"{row['P_portable']:.3f}", f"{row['P_best']:.3f}"]
        out.append("| " + " | ".join(cols) + " |")
    out += ["", "Rooflines (measured in each run; the FP32 probe is FMA-bound OpenMP code):", ""]
    for run in runs:
        rf = roofline(run)
        m = run["machine"]
        where = m.get("gpu") if run["backend"] == "gpu" else m.get("cpu")
        probe = rf["fp32_probe_tflops"]
        line = (f"- {run['label']}: {where or run['backend']}, {m.get('compiler')}, "
                f"copy {rf['copy_gb_per_s'] or 0:.0f} GB/s, FP32 probe "
                + (f"{probe:.2f} TFLOP/s" if probe else "not in this file (stated peaks used)"))
        if probe and rf["fp32_stated_tflops"]:
            line += (f" ({100 * probe / rf['fp32_stated_tflops']:.0f}% of the stated "
                     f"{rf['fp32_stated_tflops']:.1f})")
        out.append(line + f"; {run['path']}")
    for lb, why in not_run:
        out.append(f"- {lb}: {why}")
    out += ["", "* against the stated peak (bf16 matrix units, or no probe in the file); "
            "+ above the roofline (matrix units, or data held in cache), counted as 1 in P."]
    return "\n".join(out)


def plot(runs, rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matrix: matplotlib is not installed: no PNG", file=sys.stderr)
        return False
    labels = [run["label"] for run in runs]
    names = [f"{r['kernel']} {r['dtype']}" + (f" {r['shape']}" if r["shape"] != "-" else "")
             for r in rows]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.45 * len(rows) * len(labels) / 2 + 4), 9),
                             sharex=True)
    width = 0.8 / max(1, len(labels))
    for ax, kind in zip(axes, ("portable", "best")):
        for j, lb in enumerate(labels):
            ys = []
            for r in rows:
                c = (r["cells"].get(lb) or {}).get(kind)
                ys.append(100 * min(c["eff"], 1.0) if c else 0)
            ax.bar([i + (j - (len(labels) - 1) / 2) * width for i in range(len(rows))], ys, width,
                   label=lb)
        ax.set_ylabel(f"{kind}: % of roofline")
        ax.set_yscale("symlog", linthresh=1)
        ax.set_ylim(0, 100)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8, ncol=len(labels))
    axes[1].set_xticks(range(len(rows)))
    axes[1].set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    fig.suptitle("ompk portability matrix: efficiency per kernel and platform")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", action="append", required=True, metavar="LABEL=PATH[@BACKEND]")
    ap.add_argument("--not-run", action="append", default=[], metavar="LABEL=WHY")
    ap.add_argument("--md")
    ap.add_argument("--png")
    ap.add_argument("--json")
    ap.add_argument("--exact-shapes", action="store_true")
    ap.add_argument("--all-kernels", action="store_true")
    a = ap.parse_args(argv)
    runs = [load_run(s) for s in a.run]
    if len({r["label"] for r in runs}) != len(runs):
        raise SystemExit("matrix: two --run with the same label")
    not_run = [tuple(s.split("=", 1)) if "=" in s else (s, "not run") for s in a.not_run]
    rows = build(runs, a.exact_shapes, a.all_kernels)
    text = markdown(runs, not_run, rows)
    print(text)
    if a.md:
        open(a.md, "w").write(text + "\n")
    if a.png:
        plot(runs, rows, a.png)
    if a.json:
        json.dump({"runs": [{k: run[k] for k in ("label", "path", "backend", "machine")}
                            | {"roofline": roofline(run)} for run in runs],
                   "not_run": dict(not_run), "rows": rows}, open(a.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

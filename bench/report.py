#!/usr/bin/env python3
"""Merge ompk-bench JSON with peer JSON (bench/peers/*_peer.py) from the same run.

usage: report.py BENCH.json [PEER.json ...] [--out SUMMARY.json] [--md SUMMARY.md]

Matches records on (backend, kernel, dtype, shape); for each ompk record prints the time, the
efficiency on its platform (% of the copy bandwidth measured in the same run for memory-bound
kernels, % of the stated peak for kernels that report FLOPs against a peak), and the speed-up over
every peer measured for the same key (peer_ms / ompk_ms; > 1 means ompk is faster). The
performance-portability metric of each kernel/dtype (Pennycook et al.) is the harmonic mean of its
efficiencies over the platforms in the data (host, gpu), 0 if it is missing on one of them.
"""
import argparse
import json
import sys
from collections import defaultdict


def key(r):
    backend = r.get("backend", "")
    backend = {"cuda": "gpu", "cpu": "host"}.get(backend, backend)
    return (backend, r["kernel"], r.get("dtype"), r.get("shape"))


def efficiency(r):
    """Fraction of the relevant roofline, or None."""
    if r.get("pct_of_peak") is not None:
        return r["pct_of_peak"] / 100.0
    if r.get("pct_of_copy_bw") is not None:
        return r["pct_of_copy_bw"] / 100.0
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench")
    ap.add_argument("peers", nargs="*")
    ap.add_argument("--out")
    ap.add_argument("--md")
    a = ap.parse_args()
    bench = json.load(open(a.bench))
    peers = defaultdict(dict)
    for p in a.peers:
        try:
            d = json.load(open(p))
        except (OSError, ValueError) as e:
            print(f"report: skipping {p}: {e}", file=sys.stderr)
            continue
        for r in d.get("records", d if isinstance(d, list) else []):
            if r.get("ms") is None:
                continue
            peers[key(r)][r.get("peer") or r.get("variant") or "peer"] = r["ms"]
    rows, effs = [], defaultdict(dict)
    for r in bench["records"]:
        k = key(r)
        e = efficiency(r)
        ratios = {name: ms / r["ms"] for name, ms in peers.get(k, {}).items() if r["ms"]}
        rows.append({"backend": k[0], "kernel": k[1], "dtype": k[2], "shape": k[3],
                     "variant": r.get("variant"), "ms": r["ms"], "efficiency": e,
                     "speedup_vs": ratios, "peer_ms": peers.get(k, {})})
        if e is not None:
            prev = effs[(k[1], k[2])].get(k[0])
            effs[(k[1], k[2])][k[0]] = max(e, prev or 0)
    platforms = sorted({r["backend"] for r in rows})
    pp = {}
    for (kern, dt), per in effs.items():
        vals = [per.get(p) for p in platforms]
        if any(v is None or v <= 0 for v in vals):
            pp[f"{kern}/{dt}"] = 0.0
        else:
            pp[f"{kern}/{dt}"] = len(vals) / sum(1.0 / v for v in vals)
    lines = ["| backend | kernel | dtype | shape | ms | efficiency | speed-up vs peers |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        sp = ", ".join(f"{n} {v:.2f}x" for n, v in sorted(r["speedup_vs"].items())) or "-"
        eff = f"{100 * r['efficiency']:.1f}%" if r["efficiency"] is not None else "-"
        lines.append(f"| {r['backend']} | {r['kernel']} | {r['dtype']} | {r['shape']} | "
                     f"{r['ms']:.4f} | {eff} | {sp} |")
    lines += ["", f"Performance portability over {', '.join(platforms)} (harmonic mean of "
              "efficiencies):", ""]
    lines += [f"- {k}: {v:.3f}" for k, v in sorted(pp.items())]
    text = "\n".join(lines)
    print(text)
    if a.md:
        open(a.md, "w").write(text + "\n")
    if a.out:
        json.dump({"source": a.bench, "machine": {k: bench.get(k) for k in
                   ("host", "cpu", "gpu", "compiler", "date", "offload_archs")},
                   "rows": rows, "performance_portability": pp}, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()

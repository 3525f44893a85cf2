"""Merge one run's records into an earlier matrix input: the kernels this run measured replace the
earlier file's records of those kernels; the rest are kept. merged_from names both sources.
usage: merge.py EARLIER.json OUT.json RUN.json [RUN.json ...] [--probe FROM.json]
(--probe: every merged record takes FROM.json's FP32 probe, for runs whose own probe is not the
card's peak, as under GCC.)"""
import json
import sys

args = sys.argv[1:]
probe = None
if "--probe" in args:
    k = args.index("--probe")
    probe = json.load(open(args[k + 1]))["records"][0]["fp32_probe_tflops"]
    del args[k:k + 2]
earlier_path, out_path, runs = args[0], args[1], args[2:]
earlier = json.load(open(earlier_path))
new = []
for r in runs:
    new += json.load(open(r))["records"]
if probe is not None:
    for rec in new:
        rec["fp32_probe_tflops"] = probe
kernels = sorted({rec["kernel"] for rec in new})
head = json.load(open(runs[0]))
out = {k: v for k, v in head.items() if k != "records"}
out["records"] = [r for r in earlier["records"] if r["kernel"] not in kernels] + new
out["merged_from"] = {"this_run": runs, "this_run_kernels": kernels, "earlier": earlier_path}
json.dump(out, open(out_path, "w"), indent=1)
print(out_path, len(out["records"]), "records;", len(new), "from this run:", kernels)

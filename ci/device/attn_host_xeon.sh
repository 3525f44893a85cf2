#!/usr/bin/env bash
# ci/device/attn_host_xeon.sh BUNDLE_DIR [--reps N] [--warmup N] [--threads N] [info] [tests]
#   [pair...]
# The host attention measurement on the Xeon of the device machine, from a bundle_host.sh bundle
# (repo root as working directory; logs and JSON into $OUT):
#   info     lscpu and ompk-info --variants (host-amx must be marked available)
#   tests    the attention suites and test_ops' attention entries in the default order (host-amx
#            for bf16 on an AMX CPU; the suites also run portable and amx-emulated), then again
#            with OMPK_VARIANT naming host-amx
#   pair     one ompk-bench round of the host attention entries (B1 H8 N2048 dh128, fwd and bwd,
#            bf16 and f32, causal and not; fast = the default order, host-avx512 and portable),
#            then one PyTorch CPU SDPA round at the same shapes (bench/peers/attention_peer.py
#            --device cpu), and the ratio of each ompk record to SDPA; repeat `pair` to interleave
#            (ompk, peer, ompk, peer), so each ratio comes from the same minutes
# --threads N sets the peer's torch.set_num_threads (default: PyTorch's choice; ompk uses
# OpenMP's default, every logical CPU). Options apply to the steps after them.
set -uo pipefail
B=$(cd "$1" && pwd)
shift
d=/tmp/ompk-host
[ -f "$d/env.sh" ] || bash "$B/run_host.sh" "$d"
. "$d/env.sh"
reps=5 warmup=2 threads=0 round=0
sum=$OUT/summary.txt
lscpu | grep -E 'Model name|^CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node\(s\)|L2 cache|L3 cache|MHz|Hypervisor' >>"$sum"
while [ $# -gt 0 ]; do
    s=$1
    shift
    case $s in
    --reps) reps=$1; shift ;;
    --warmup) warmup=$1; shift ;;
    --threads) threads=$1; shift ;;
    info)
        lscpu >"$OUT/lscpu.txt"
        grep -o -w -E 'amx_(tile|bf16|int8)|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ' >>"$sum"
        echo >>"$sum"
        "$d/bin/ompk-info" --variants >"$OUT/ompk-info.txt" 2>&1
        grep -A7 -E '^attention_(fwd|bwd):' "$OUT/ompk-info.txt" >>"$sum"
        ;;
    tests)
        one() { # label cmd...: one line in the summary, the whole log appended to tests.log
            local label=$1 rc
            shift
            "$@" --jobs 4 >/tmp/ompk-t.log 2>&1
            rc=$?
            { echo "==== $label rc=$rc"; cat /tmp/ompk-t.log; } >>"$OUT/tests.log"
            echo "$label rc=$rc $(grep -a Synthesis /tmp/ompk-t.log | tail -1)" >>"$sum"
        }
        suites="test_attention_fwd test_attention_bwd test_attention_nonfinite test_attention_fixtures test_attention_bad"
        for sel in "" "attention_fwd:host-amx,attention_bwd:host-amx"; do
            for t in $suites; do one "${sel:+OMPK_VARIANT=$sel }$t" env OMPK_VARIANT="$sel" "$d/bin/$t"; done
            one "${sel:+OMPK_VARIANT=$sel }test_ops attention" env OMPK_VARIANT="$sel" \
                "$d/bin/test_ops" --filter 'ops/attention*'
        done
        ;;
    pair)
        round=$((round + 1))
        echo "== round $round: ompk-bench (reps $reps, warmup $warmup) $(date -u +%T)" >>"$sum"
        "$d/bin/ompk-bench" --backend host --filter attention --reps "$reps" --warmup "$warmup" \
            --json "$OUT/bench-$round.json" >"$OUT/bench-$round.log" 2>&1
        echo "exit $?" >>"$sum"
        grep -E '^host +attention' "$OUT/bench-$round.log" >>"$sum"
        echo "== round $round: peer $(date -u +%T)" >>"$sum"
        targs=()
        [ "$threads" -gt 0 ] && targs=(--threads "$threads")
        (cd /tmp && env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 python3 "$d/peers/attention_peer.py" \
            --device cpu --reps "$reps" "${targs[@]}" --json "$OUT/peer-$round.json") \
            >"$OUT/peer-$round.log" 2>&1
        echo "peer exit $?" >>"$sum"
        cat "$OUT/peer-$round.log" >>"$sum"
        # speed-up over SDPA (sdpa_ms / ompk_ms, > 1: ompk faster) of every ompk record
        env -u LD_LIBRARY_PATH python3 - "$OUT/bench-$round.json" "$OUT/peer-$round.json" \
            >"$OUT/ratio-$round.txt" 2>&1 <<'PY'
import json, sys
key = lambda r: (r["kernel"], r["dtype"], r["shape"])
peer = {key(r): r["ms"] for r in json.load(open(sys.argv[2]))["records"] if r.get("ms")}
for r in json.load(open(sys.argv[1]))["records"]:
    p = peer.get(key(r))
    x = f"{p / r['ms']:.2f}x" if p and r.get("ms") else "-"
    print(f"ratio {r['kernel']:14s} {r['dtype']:4s} {r['shape']:28s} {r['variant'] or '-':12s} "
          f"ompk {r['ms']:9.3f} ms  sdpa {p or 0:9.3f} ms  {x}")
PY
        cat "$OUT/ratio-$round.txt" >>"$sum"
        ;;
    *) echo "unknown step $s" >>"$sum" ;;
    esac
done
cat "$sum"

#!/usr/bin/env bash
# ci/device/moe_sft_xeon.sh BUNDLE_DIR [--filter S] [--reps N] [--warmup N] [tests] [peak]
#   [bench[=LIB]] [peer] [gemm]
# The MoE fine-tuning measurement on the Xeon of the device machine, from a bundle_host.sh bundle
# (repo root as working directory; logs and JSON into $OUT):
#   tests      the MoE suites (each runs every ISA the CPU has: amx, avx512bf16, amx-emulated,
#              portable), then test_moe_sft and test_moe_sft_fixtures again under OMPK_ISA=amx
#              and OMPK_ISA=avx512bf16
#   peak       extra/amx_peak (the AMX ceilings, bench/amx)
#   topo       which vCPUs share an AMX unit: amx_peak's TDPBF16PS rate on 1 thread, on every
#              thread, and on 2 threads pinned to vCPU 0 and vCPU j for each j (a pair that
#              shares one physical core halves the per-thread rate)
#   bench      ompk-bench --filter S (default moe_sft_step) --reps N (default 3) --warmup N
#              (default 2); bench=LIB runs it on extra/LIB instead of the bundle's libompk (a
#              baseline library)
#   peer       bench/peers/moe_sft_peer.py --filter S --reps N with the machine's PyTorch
#   gemm       bench/peers/amx_gemm_peer.py: PyTorch's own bf16 GEMM per core (the practical ceiling)
#   pair       bench/peers/moe_sft_pair.py: the ompk.torch.MoE step and PyTorch's alternating step
#              by step in one process (--reps N pairs), E64 bf16 r8 split and GRAD_BF16, r32,
#              int8 split and GRAD_BF16, E128 bf16 r8; pair-N.json, one per case
# Options apply to the steps after them. Repeated bench and peer steps (interleaved pairs, so a
# ratio compares the same minutes) number their files: bench-TAG-N.json, peer-N.json.
set -uo pipefail
B=$(cd "$1" && pwd)
shift
d=/tmp/ompk-host
[ -f "$d/env.sh" ] || bash "$B/run_host.sh" "$d"
. "$d/env.sh"
filter=moe_sft_step reps=3 warmup=2 nb=0 np=0 npair=0
sum=$OUT/summary.txt
lscpu | grep -E 'Model name|^CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node\(s\)|L2 cache|L3 cache|MHz|Hypervisor' >>"$sum"
while [ $# -gt 0 ]; do
    s=$1
    shift
    case $s in
    --filter) filter=$1; shift ;;
    --reps) reps=$1; shift ;;
    --warmup) warmup=$1; shift ;;
    tests)
        one() { # label cmd...: one line in the summary, the whole log appended to tests.log
            local label=$1 rc
            shift
            "$@" --jobs 4 >/tmp/ompk-t.log 2>&1
            rc=$?
            { echo "==== $label rc=$rc"; cat /tmp/ompk-t.log; } >>"$OUT/tests.log"
            echo "$label rc=$rc $(grep -a Synthesis /tmp/ompk-t.log | tail -1)" >>"$sum"
        }
        for t in "$d"/bin/test_moe*; do one "$(basename "$t")" "$t"; done
        for isa in amx avx512bf16; do
            for t in test_moe_sft test_moe_sft_fixtures; do
                one "OMPK_ISA=$isa $t" env OMPK_ISA=$isa "$d/bin/$t"
            done
        done
        ;;
    peak) "$d/extra/amx_peak" >>"$sum" 2>&1 ;;
    topo)
        n=$(nproc)
        echo "== topo ($n vCPUs; TDPBF16PS, register-resident tiles)" >>"$sum"
        OMP_NUM_THREADS=1 OMP_PLACES="{0}" OMP_PROC_BIND=true "$d/extra/amx_peak" 4000000 |
            grep 'peak TDPBF16PS 1 thread' >>"$sum" 2>&1
        OMP_PROC_BIND=true OMP_PLACES=cores "$d/extra/amx_peak" 4000000 |
            grep "peak TDPBF16PS $n threads" >>"$sum" 2>&1
        for j in $(seq 1 $((n - 1))); do
            echo "vCPU 0 + $j: $(OMP_NUM_THREADS=2 OMP_PLACES="{0},{$j}" OMP_PROC_BIND=true \
                "$d/extra/amx_peak" 4000000 | grep 'peak TDPBF16PS 2 threads')" >>"$sum"
        done
        ;;
    bench*)
        lib=${s#bench}
        lib=${lib#=}
        nb=$((nb + 1))
        tag=${lib:-new}-$nb
        if [ -n "$lib" ]; then
            mkdir -p "$d/alt" && cp "$d/extra/$lib" "$d/alt/libompk.so.0.1"
            pre="$d/alt:"
        else
            pre=""
        fi
        echo "== bench $tag (reps $reps, warmup $warmup) $(date -u +%T)" >>"$sum"
        LD_LIBRARY_PATH="$pre$LD_LIBRARY_PATH" "$d/bin/ompk-bench" --backend host --filter "$filter" \
            --reps "$reps" --warmup "$warmup" --json "$OUT/bench-$tag.json" >"$OUT/bench-$tag.log" 2>&1
        echo "exit $?" >>"$sum"
        grep -E '^ +moe_sft' "$OUT/bench-$tag.log" >>"$sum"
        ;;
    peer)
        np=$((np + 1))
        echo "== peer $np (reps $reps) $(date -u +%T)" >>"$sum"
        (cd /tmp && env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 python3 "$d/peers/moe_sft_peer.py" \
            --filter "$filter" --reps "$reps" --json "$OUT/peer-$np.json") >"$OUT/peer-$np.log" 2>&1
        echo "peer exit $?" >>"$sum"
        tail -12 "$OUT/peer-$np.log" >>"$sum"
        ;;
    pair)
        # the repo's python/ package over the bundle's libompk; KMP_BLOCKTIME: ompk's idle
        # threads stop spinning 20 ms after a step instead of 200, so they do not slow torch's
        for c in "64,2048,1408,6,4096 8 bf16 split" "64,2048,1408,6,4096 8 bf16 bf16" \
            "64,2048,1408,6,4096 32 bf16 split" "64,2048,1408,6,4096 8 int8 split" \
            "64,2048,1408,6,4096 8 int8 bf16" "128,2048,768,8,1024 8 bf16 split"; do
            read -r shp rk fmt gr <<<"$c"
            npair=$((npair + 1))
            echo "== pair $npair: $shp r$rk $fmt grad $gr ($reps pairs) $(date -u +%T)" >>"$sum"
            PYTHONPATH="$PWD/python" OMPK_LIBRARY="$d/lib/libompk.so.0.1" KMP_BLOCKTIME=20 \
                PYTHONUNBUFFERED=1 python3 bench/peers/moe_sft_pair.py --shape "$shp" --rank "$rk" \
                --format "$fmt" --grad "$gr" --pairs "$reps" --json "$OUT/pair-$npair.json" \
                >"$OUT/pair-$npair.log" 2>&1
            echo "pair exit $?" >>"$sum"
            tail -1 "$OUT/pair-$npair.log" >>"$sum"
        done
        ;;
    gemm)
        (cd /tmp && env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 python3 "$d/peers/amx_gemm_peer.py" \
            --json "$OUT/gemm-peer.json") >"$OUT/gemm-peer.log" 2>&1
        echo "gemm peer exit $?" >>"$sum"
        cat "$OUT/gemm-peer.log" >>"$sum"
        ;;
    esac
done
cat "$sum"

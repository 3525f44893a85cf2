#!/usr/bin/env bash
# A/B/C: old (.carry/old 4628b63), mid (.carry/mid 049a709 ldmatrix), new (.carry/main cp.async ring, ring 2 and 3)
B=.carry/main
for b in .carry/main .carry/mid .carry/old; do bash $b/run.sh info > $OUT/info-$(basename $b).txt 2>&1; done
rt=/tmp/ompk-rt
R() { local b=$1; shift; env LD_LIBRARY_PATH="$rt:$b/lib:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu" OMP_TARGET_OFFLOAD=MANDATORY OMPK_FIXTURE_DIR=$b/fixtures "$@"; }
for t in test_mhc_pre_tc test_mhc_pre test_mhc_pre_bad; do echo "== $t"; R $B $B/bin/tests/$t --jobs 1 2>&1 | tail -1; done
echo "== ring 3"; R $B env OMPK_MHC_PRE_TCW_RING=3 $B/bin/tests/test_mhc_pre_tc --jobs 1 2>&1 | tail -1
for i in 1 2; do
  for v in old mid new new3; do b=$B; [ $v = old ] && b=.carry/old; [ $v = mid ] && b=.carry/mid
    ring=2; [ $v = new3 ] && ring=3
    R $b env OMPK_MHC_PRE_TCW_RING=$ring $b/bin/ompk-bench --backend gpu --filter mhc_pre --reps 40 --json $OUT/bench-$v-$i.json > $OUT/bench-$v-$i.log 2>&1
    echo "$v $i"; grep -E "mhc_pre_fwd +bf16.* (-|tc-wide) |mhc_pre_fwd_sinkhorn_bwd +bf16.* - " $OUT/bench-$v-$i.log
  done
done
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for ring in 2 3; do
R $B env OMPK_MHC_PRE_TCW_RING=$ring $NCU --kernel-name regex:tcw_gemm_l4 --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis \
  --metrics smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_mio_throttle.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_lg_throttle.ratio,l1tex__t_sector_hit_rate.pct \
  $B/bin/ompk-bench --backend gpu --filter mhc_pre --reps 2 > $OUT/ncu_r$ring.txt 2>&1
echo "== ncu ring $ring"; grep -E "Duration|DRAM Throughput|Compute \(SM\)|L1/TEX Hit|L2 Hit|Issued Warp|No Eligible|Warp Cycles Per Issued|Achieved Occ|Block Limit|stalled|sector_hit" $OUT/ncu_r$ring.txt | head -24
done
cd $OUT && tar czf all.tgz *.txt *.log *.json && rm -f *.txt *.log *.json

#!/usr/bin/env bash
# A/B of the wide GEMM (old: .carry/old = 4628b63, new: .carry/main), mhc_pre suites on the GPU, ncu
B=.carry/main; O=.carry/old
bash $B/run.sh info > $OUT/info.txt 2>&1; bash $O/run.sh info >/dev/null 2>&1
rt=/tmp/ompk-rt
R() { local b=$1; shift; env LD_LIBRARY_PATH="$rt:$b/lib:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu" OMP_TARGET_OFFLOAD=MANDATORY OMPK_FIXTURE_DIR=$b/fixtures "$@"; }
for t in test_mhc_pre_tc test_mhc_pre test_mhc_pre_bad; do echo "== $t"; R $B $B/bin/tests/$t --jobs 1 2>&1 | tail -1; done
for i in 1 2; do
  for v in old new; do b=$B; [ $v = old ] && b=$O
    R $b $b/bin/ompk-bench --backend gpu --filter mhc_pre --reps 40 --json $OUT/bench-$v-$i.json > $OUT/bench-$v-$i.log 2>&1
    echo "$v $i"; grep -E "mhc_pre_fwd +bf16.* (-|tc-wide|tc-rot) |mhc_pre_fwd_sinkhorn_bwd +bf16.* - " $OUT/bench-$v-$i.log
  done
done
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
R $B $NCU --kernel-name regex:tcw_gemm_l37 --launch-skip 1 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats \
  $B/bin/ompk-bench --backend gpu --filter mhc_pre --reps 2 > $OUT/ncu_tcw.txt 2>&1
R $B $NCU --launch-skip 0 --launch-count 12 --section SpeedOfLight $B/bin/ompk-bench --backend gpu --filter mhc_pre --reps 2 > $OUT/ncu_seq.txt 2>&1
echo "== ncu tcw"; grep -E "Duration|DRAM Throughput|Compute \(SM\)|Registers|Warp Cycles Per Issued|Issued Warp|No Eligible|Achieved Occ" $OUT/ncu_tcw.txt | head -14
echo "== ncu seq"; grep -E "^  [_a-zA-Z].*\(|Duration" $OUT/ncu_seq.txt | head -40

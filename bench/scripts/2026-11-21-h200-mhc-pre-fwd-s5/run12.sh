#!/usr/bin/env bash
# teams sweep of the cp.async-ring wide GEMM (e376701)
B=.carry/main
bash $B/run.sh info > /dev/null 2>&1
rt=/tmp/ompk-rt
R() { env LD_LIBRARY_PATH="$rt:$B/lib:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu" OMP_TARGET_OFFLOAD=MANDATORY OMPK_FIXTURE_DIR=$B/fixtures "$@"; }
for i in 1 2; do
for t in 256 512 768 1024; do
  R env OMPK_MHC_PRE_TCW_TEAMS=$t $B/bin/ompk-bench --backend gpu --filter mhc_pre --reps 40 --json $OUT/bench-t$t-$i.json > $OUT/bench-t$t-$i.log 2>&1
  echo "teams $t pass $i"; grep -E "mhc_pre_fwd +bf16.* (-|tc-wide|tc-rot) |mhc_pre_fwd_sinkhorn_bwd +bf16.* - " $OUT/bench-t$t-$i.log
done; done
R env OMPK_MHC_PRE_TCW_TEAMS=256 $B/bin/tests/test_mhc_pre_tc --jobs 1 2>&1 | tail -1
cd $OUT && tar czf all.tgz *.log *.json && rm -f *.log *.json

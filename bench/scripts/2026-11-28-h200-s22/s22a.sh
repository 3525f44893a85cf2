#!/bin/bash
B=.carry/new
R=$OUT/r; mkdir -p $R
rt=/tmp/ompk-rt; mkdir -p $rt; tar -C $rt -xJf .carry/runtime/runtime.tar.xz
tar -C $B -xJf $B/lib.tar.xz
fd=$(cat $B/fixture_dir); mkdir -p $(dirname $fd); [ -e $fd ] || ln -s $PWD/$B/fixtures $fd
export LD_LIBRARY_PATH="$rt:$B/lib:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu"
export OMP_TARGET_OFFLOAD=MANDATORY OMPK_TEST_DEVICES=all OMPK_GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader|head -1)"
nvidia-smi -L > $R/info.txt
s=$(date +%s)
timeout 120 $B/bin/ompk-bench --backend gpu --reps 20 --warmup 5 --impl default,portable --filter mhc_pre --json $R/gpu_mhc_pre.json > $R/gpu_mhc_pre.txt 2>&1
echo "bench $(( $(date +%s) - s ))s" >> $R/times.txt
for t in $B/bin/tests/test_*; do n=$(basename $t); timeout 150 $t --jobs 1 > $R/$n.log 2>&1; echo "$n rc=$? $(grep -a Synthesis $R/$n.log | tail -1)" >> $R/tests.txt; done
echo "tests $(( $(date +%s) - s ))s" >> $R/times.txt
timeout 150 ncu --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis -k regex:pre_tile_gemm_4 -c 1 $B/bin/ompk-bench --backend gpu --reps 1 --warmup 0 --impl portable --filter mhc_pre > $R/ncu_gemm.txt 2>&1
timeout 100 ncu --section SpeedOfLight -k regex:"pre_tile_gemm_4|pre_stages_4" -c 4 $B/bin/ompk-bench --backend gpu --reps 1 --warmup 0 --impl portable --filter mhc_pre > $R/ncu_sol.txt 2>&1
echo "ncu $(( $(date +%s) - s ))s" >> $R/times.txt
cat $R/times.txt $R/tests.txt
grep -E "mhc_pre .*n4 D4096" $R/gpu_mhc_pre.txt | head; grep -E "Duration|Registers|Achieved Occ|Theoretical Occ|Stall|Warp Cycles|Issued" $R/ncu_gemm.txt | head -30; grep -E "Duration|pre_" $R/ncu_sol.txt | head -20
cd $OUT && tar czf r.tgz r && rm -rf r

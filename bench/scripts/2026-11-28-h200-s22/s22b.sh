#!/bin/bash
B=.carry/new
R=$OUT/r; mkdir -p $R
rt=/tmp/ompk-rt; mkdir -p $rt; tar -C $rt -xJf .carry/runtime/runtime.tar.xz
tar -C $B -xJf $B/lib.tar.xz
fd=$(cat $B/fixture_dir); mkdir -p $(dirname $fd); [ -e $fd ] || ln -s $PWD/$B/fixtures $fd
BASE="$rt:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu"
export OMP_TARGET_OFFLOAD=MANDATORY OMPK_TEST_DEVICES=all OMPK_GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader|head -1)"
nvidia-smi -L > $R/info.txt
s=$(date +%s)
for r in 1 2; do for v in B; do
  if [ $v = A ]; then L=/tmp/vA/lib; else L=$B/lib; fi
  LD_LIBRARY_PATH="$L:$BASE" timeout 100 $B/bin/ompk-bench --backend gpu --reps 20 --warmup 5 --impl default,portable --filter mhc_pre --json $R/fwd_${v}$r.json > $R/fwd_${v}$r.txt 2>&1
done; done
echo "bench $(( $(date +%s) - s ))s" >> $R/times.txt
export LD_LIBRARY_PATH="$B/lib:$BASE"
for t in $B/bin/tests/test_*; do n=$(basename $t); timeout 150 $t --jobs 1 > $R/$n.log 2>&1; echo "$n rc=$? $(grep -a Synthesis $R/$n.log | tail -1)" >> $R/tests.txt; done
echo "tests $(( $(date +%s) - s ))s" >> $R/times.txt
timeout 100 ncu --section SpeedOfLight --section LaunchStats -k regex:"pre_tile_gemm_4|pre_stages_4" -c 4 $B/bin/ompk-bench --backend gpu --reps 1 --warmup 0 --impl portable --filter mhc_pre > $R/ncu_sol.txt 2>&1
echo "ncu $(( $(date +%s) - s ))s" >> $R/times.txt
cat $R/times.txt $R/tests.txt
for f in $R/fwd_*.txt; do echo "== $f"; grep -E "mhc_pre_(fwd|bwd) .*n4 D4096 .*(portable|tc-wide|tc )" $f; done
grep -E "Duration|pre_|Registers" $R/ncu_sol.txt | head -24
cd $OUT && tar czf r.tgz r && rm -rf r

#!/bin/bash
B=.carry/new
R=$OUT/r; mkdir -p $R
rt=/tmp/ompk-rt; mkdir -p $rt; tar -C $rt -xJf .carry/runtime/runtime.tar.xz
tar -C $B -xJf $B/lib.tar.xz
fd=$(cat $B/fixture_dir); mkdir -p $(dirname $fd); [ -e $fd ] || ln -s $PWD/$B/fixtures $fd
export LD_LIBRARY_PATH="$B/lib:$rt:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu"
export OMP_TARGET_OFFLOAD=MANDATORY OMPK_TEST_DEVICES=all OMPK_GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader|head -1)"
nvidia-smi -L > $R/info.txt
s=$(date +%s)
for t in $B/bin/tests/test_*; do n=$(basename $t); timeout 150 $t --jobs 1 > $R/$n.log 2>&1; echo "$n rc=$? $(grep -a Synthesis $R/$n.log | tail -1)" >> $R/tests.txt; done
echo "tests $(( $(date +%s) - s ))s" >> $R/times.txt
for r in 1 2 3; do timeout 100 $B/bin/ompk-bench --backend gpu --reps 30 --warmup 5 --filter mhc_pre --json $R/dec_new$r.json > $R/dec_new$r.txt 2>&1; done
echo "bench $(( $(date +%s) - s ))s" >> $R/times.txt
cat $R/times.txt $R/tests.txt
cd $OUT && tar czf r.tgz r && rm -rf r

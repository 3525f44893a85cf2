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
for t in $B/bin/tests/test_mhc_*; do n=$(basename $t); timeout 150 $t --jobs 1 > $R/$n.log 2>&1; echo "$n rc=$? $(grep -a Synthesis $R/$n.log | tail -1)" >> $R/tests.txt; done
timeout 150 $B/bin/tests/test_ops --jobs 1 --filter 'ops/mhc*' > $R/test_ops_mhc.log 2>&1; echo "test_ops mhc rc=$? $(grep -a Synthesis $R/test_ops_mhc.log | tail -1)" >> $R/tests.txt
for e in mhc_decode mhc_layer; do timeout 60 $B/bin/$e > $R/$e.log 2>&1; echo "$e rc=$?" >> $R/tests.txt; done
echo "tests $(( $(date +%s) - s ))s" >> $R/times.txt
cat $R/times.txt $R/tests.txt
cd $OUT && tar czf r.tgz r && rm -rf r

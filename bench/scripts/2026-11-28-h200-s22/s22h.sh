#!/bin/bash
R=$OUT/r; mkdir -p $R; s=$(date +%s)
B=.carry/gcc
tar -C $B -xJf $B/gcc.tar.xz
fd=$(cat $B/fixture_dir); mkdir -p $(dirname $fd); [ -e $fd ] || ln -s $PWD/$B/fixtures $fd
mkdir -p /tmp/cc
E="OMPK_FIXTURE_DIR=$fd OMPK_TEST_DEVICES=all LD_LIBRARY_PATH=$B/lib:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu OMP_TARGET_OFFLOAD=MANDATORY CUDA_CACHE_PATH=/tmp/cc CUDA_CACHE_MAXSIZE=4294967296"
nvidia-smi -L > $R/info.txt
for t in test_mhc_pre test_mhc_post_pre test_mhc_pre_bad; do
  timeout 200 env $E $B/bin/tests/$t --jobs 1 > $R/$t.log 2>&1; echo "$t rc=$? $(( $(date +%s) - s ))s $(grep -a Synthesis $R/$t.log | tail -1)" >> $R/tests.txt
done
timeout 200 env $E $B/bin/tests/test_ops --jobs 1 --filter 'ops/mhc*' > $R/test_ops_mhc.log 2>&1; echo "test_ops mhc rc=$? $(( $(date +%s) - s ))s $(grep -a Synthesis $R/test_ops_mhc.log | tail -1)" >> $R/tests.txt
cat $R/tests.txt
cd $OUT && tar czf r.tgz r && rm -rf r

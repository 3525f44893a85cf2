#!/bin/bash
B=.carry/new
R=$OUT/r; mkdir -p $R
rt=/tmp/ompk-rt; mkdir -p $rt; tar -C $rt -xJf .carry/runtime/runtime.tar.xz
tar -C $B -xJf $B/lib.tar.xz
fd=$(cat $B/fixture_dir); mkdir -p $(dirname $fd); [ -e $fd ] || ln -s $PWD/$B/fixtures $fd
export LD_LIBRARY_PATH="$B/lib:$rt:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu"
export OMP_TARGET_OFFLOAD=MANDATORY OMPK_TEST_DEVICES=all
nvidia-smi -L > $R/info.txt
for t in test_mhc_pre test_mhc_pre_bwd_team_emu; do timeout 150 $B/bin/tests/$t --jobs 1 > $R/$t.log 2>&1; echo "$t rc=$? $(grep -a Synthesis $R/$t.log | tail -1)" >> $R/tests.txt; done
timeout 150 $B/bin/tests/test_ops --jobs 1 --filter 'ops/mhc*' > $R/test_ops_mhc.log 2>&1; echo "test_ops mhc rc=$? $(grep -a Synthesis $R/test_ops_mhc.log | tail -1)" >> $R/tests.txt
cat $R/tests.txt
cd $OUT && tar czf r.tgz r && rm -rf r

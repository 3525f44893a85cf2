#!/bin/bash
B=.carry/new
R=$OUT/r; mkdir -p $R
rt=/tmp/ompk-rt; mkdir -p $rt; tar -C $rt -xJf .carry/rtslim/runtime.tar.xz
tar -C $B -xJf $B/lib.tar.xz; mkdir -p /tmp/vC; tar -C /tmp/vC -xJf $B/varC.tar.xz
BASE="$rt:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu"
export OMP_TARGET_OFFLOAD=MANDATORY OMPK_GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader|head -1)"
nvidia-smi -L > $R/info.txt
for r in 1 2; do for v in old new; do
  if [ $v = old ]; then L=/tmp/vC/lib; else L=$B/lib; fi
  LD_LIBRARY_PATH="$L:$BASE" timeout 100 $B/bin/ompk-bench --backend gpu --reps 20 --warmup 5 --impl default,portable --filter mhc_pre --json $R/bwd_${v}$r.json > $R/bwd_${v}$r.txt 2>&1
done; done
for f in $R/bwd_*.txt; do echo "== $f"; grep -E "mhc_pre_bwd .*(n4 D4096|n8 D2048) .*(portable|tc )" $f; done
cd $OUT && tar czf r.tgz r && rm -rf r

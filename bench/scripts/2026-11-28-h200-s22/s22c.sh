#!/bin/bash
B=.carry/new
R=$OUT/r; mkdir -p $R
rt=/tmp/ompk-rt; mkdir -p $rt; tar -C $rt -xJf .carry/rtslim/runtime.tar.xz
tar -C $B -xJf $B/lib.tar.xz; mkdir -p /tmp/vB; tar -C /tmp/vB -xJf $B/varB.tar.xz
BASE="$rt:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu"
export OMP_TARGET_OFFLOAD=MANDATORY OMPK_GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader|head -1)"
nvidia-smi -L > $R/info.txt
s=$(date +%s)
for r in 1 2; do for v in old new; do
  if [ $v = old ]; then L=/tmp/vB/lib; else L=$B/lib; fi
  LD_LIBRARY_PATH="$L:$BASE" timeout 100 $B/bin/ompk-bench --backend gpu --reps 30 --warmup 5 --filter mhc_pre --json $R/dec_${v}$r.json > $R/dec_${v}$r.txt 2>&1
done; done
echo "bench $(( $(date +%s) - s ))s" >> $R/times.txt
cat $R/times.txt
for f in $R/dec_*.txt; do echo "== $f"; grep -E "B1 S(1|16|64) " $f | grep -E "mhc_pre_fwd |mhc_post_pre_fwd|mhc_post_then" ; done
cd $OUT && tar czf r.tgz r && rm -rf r

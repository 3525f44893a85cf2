#!/bin/bash
B=.carry/new
R=$OUT/r; mkdir -p $R
rt=/tmp/ompk-rt; mkdir -p $rt; tar -C $rt -xJf .carry/runtime/runtime.tar.xz
tar -C $B -xJf $B/lib.tar.xz
export LD_LIBRARY_PATH="$B/lib:$rt:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu"
export OMP_TARGET_OFFLOAD=MANDATORY OMPK_GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader|head -1)"
nvidia-smi -L > $R/info.txt
M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
timeout 150 ncu --metrics "$M" --section SchedulerStats --section Occupancy -k regex:pre_bwd_launch_4_l158 -c 1 $B/bin/ompk-bench --backend gpu --reps 1 --warmup 0 --impl portable --filter mhc_pre > $R/ncu_bwd_stage4_stalls.txt 2>&1
timeout 150 ncu --import-source no --section SourceCounters --section WarpStateStats -k regex:pre_bwd_launch_4_l158 -c 1 -o $R/bwd4 $B/bin/ompk-bench --backend gpu --reps 1 --warmup 0 --impl portable --filter mhc_pre > $R/ncu_bwd4_rep.txt 2>&1
timeout 60 ncu --import $R/bwd4.ncu-rep --page source --csv --print-source sass > $R/bwd4_sass.csv 2>$R/bwd4_sass.err
rm -f $R/bwd4.ncu-rep
ls -la $R
grep -E "stalled|Issued Warp|Eligible" $R/ncu_bwd_stage4_stalls.txt | sort -k3 -n -r | head -30
cd $OUT && tar czf r.tgz r && rm -rf r

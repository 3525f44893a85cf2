#!/usr/bin/env bash
# ncu detail of the wide GEMM (new build): stall reasons, L2/DRAM, source hot spots
B=.carry/main
bash $B/run.sh info > /dev/null 2>&1
rt=/tmp/ompk-rt
R() { env LD_LIBRARY_PATH="$rt:$B/lib:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu" OMP_TARGET_OFFLOAD=MANDATORY "$@"; }
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
R $NCU --kernel-name regex:tcw_gemm_l37 --launch-skip 1 --launch-count 1 --set full --import-source no \
  $B/bin/ompk-bench --backend gpu --filter mhc_pre --reps 2 > $OUT/ncu_full.txt 2>&1
R $NCU --kernel-name regex:tcw_gemm_l37 --launch-skip 1 --launch-count 1 --section SourceCounters --print-details all \
  $B/bin/ompk-bench --backend gpu --filter mhc_pre --reps 2 > $OUT/ncu_src.txt 2>&1
R $NCU --kernel-name regex:tcw_gemm_l37 --launch-skip 1 --launch-count 1 --metrics lts__t_sectors_srcunit_tex_op_read.sum,lts__t_bytes.sum.per_second,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum,dram__bytes_read.sum,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_mio_throttle.ratio,smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,smsp__average_warp_latency_issue_stalled_lg_throttle.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_dispatch_stall.ratio,smsp__average_warp_latency_issue_stalled_not_selected.ratio,smsp__average_warp_latency_issue_stalled_selected.ratio,smsp__average_warp_latency_issue_stalled_membar.ratio,smsp__average_warp_latency_issue_stalled_tex_throttle.ratio,smsp__average_warp_latency_issue_stalled_imc_miss.ratio,smsp__average_warp_latency_issue_stalled_drain.ratio,smsp__average_warp_latency_issue_stalled_no_instruction.ratio,smsp__average_warp_latency_issue_stalled_branch_resolving.ratio,smsp__average_warp_latency_issue_stalled_sleeping.ratio \
  $B/bin/ompk-bench --backend gpu --filter mhc_pre --reps 2 > $OUT/ncu_met.txt 2>&1
grep -E "stalled|lts__|dram__|l1tex" $OUT/ncu_met.txt
grep -E "Throughput|Duration|Hit Rate|Mem Busy|Max Bandwidth|Pipe|Eligible|Issued|Occupancy|Stall|Warp Cycles" $OUT/ncu_full.txt | head -60
cd $OUT && tar czf ncu.tgz ncu_*.txt && rm ncu_*.txt

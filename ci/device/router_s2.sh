#!/usr/bin/env bash
# Usage (bundle first: ci/device/bundle.sh build-gpu /work/main/.carry/router, then copy this file
# there as s2.sh): run(carry=[".carry/runtime", ".carry/router"], command="bash .carry/router/s2.sh").
# router session-2 device run: bench, peers, tests (GPU), an A/B of the N > 64, k <= 11 forward
# (arg-max rounds, the default, vs OMPK_ROUTER_VARIANT=sort), ncu of two f32 forward kernels.
R=.carry/router/run.sh
O=$OUT
LIBS=/tmp/ompk-rt:.carry/router/lib:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu
timeout 50 bash $R info bench --filter router > $O/bench.txt 2>&1; mkdir -p $O/b && cp /tmp/ompk-out/bench.json /tmp/ompk-out/bench.log /tmp/ompk-out/info.txt $O/b/ 2>/dev/null
timeout 70 bash $R peers --filter router > $O/peers.txt 2>&1; mkdir -p $O/p && cp /tmp/ompk-out/router_peer.json /tmp/ompk-out/router_peer.log $O/p/ 2>/dev/null
OMP_WAIT_POLICY=passive timeout 70 bash $R tests --filter router > $O/tests.txt 2>&1; mkdir -p $O/t && cp /tmp/ompk-out/summary.txt $O/t/ 2>/dev/null
for f in /tmp/ompk-out/test_router_*.log; do grep -a -E "FAIL|Assert|got|expected" $f | head -5; done > $O/t/fails.txt 2>&1
env LD_LIBRARY_PATH=$LIBS OMP_TARGET_OFFLOAD=MANDATORY OMPK_ROUTER_VARIANT=sort timeout 15 .carry/router/bin/ompk-bench --backend gpu --filter router_topk_fwd --json $O/b/bench_sort.json > $O/bench_sort.txt 2>&1
for kn in l663 l667; do env LD_LIBRARY_PATH=$LIBS OMP_TARGET_OFFLOAD=MANDATORY timeout 20 ncu -k regex:rt_fwd_bare_$kn -c 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats .carry/router/bin/ompk-bench --backend gpu --filter router_topk_fwd --reps 1 > $O/ncu_$kn.txt 2>&1; done
grep -E "^(gpu|host) " $O/bench.txt; echo "-- sort"; grep -E "^gpu " $O/bench_sort.txt; echo "-- peers"; grep -E "gpu|host" $O/peers.txt | tail -20; echo "-- tests"; tail -8 $O/tests.txt; head -20 $O/t/fails.txt
for kn in l663 l667; do echo "-- ncu $kn"; grep -E "rt_fwd_bare|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Grid Size|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Compute \(SM\) Throughput|Executed Ipc A|Stall" $O/ncu_$kn.txt | head -16; done
tar -C $O -czf $O/extra.tgz b p t 2>/dev/null && rm -rf $O/b $O/p $O/t  # the device tool returns a limited number of files

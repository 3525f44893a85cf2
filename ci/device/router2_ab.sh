#!/usr/bin/env bash
# Usage (after ci/device/bundle.sh build-gpu /work/main/.carry/router2 from the router2 tree):
#   run(carry=[".carry/runtime", ".carry/router2"], timeout_s=240,
#       command="bash ci/device/router2_ab.sh")
# A/B of the N <= 64, k <= 11 GPU forward: the default kernel (one token per warp) against
# OMPK_ROUTER_VARIANT=pair (two tokens per warp, bf16 as 32-bit keys). The bench emits the N64
# k8/k32 f32/bf16 shapes under both in one process (JSON field "variant": null or "pair"); the
# GPU forward tests run once under the variant (the default is covered by the usual test run);
# ncu profiles the first launch of the default N64 k8 kernel and of the two pair kernels.
R=.carry/router2/run.sh
O=$OUT
LIBS=/tmp/ompk-rt:.carry/router2/lib:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu
timeout 60 bash $R info bench --filter router_topk_fwd > $O/bench.txt 2>&1
mkdir -p $O/b && cp /tmp/ompk-out/bench.json /tmp/ompk-out/bench.log /tmp/ompk-out/info.txt $O/b/ 2>/dev/null
OMPK_ROUTER_VARIANT=pair timeout 60 bash $R tests --filter router_fwd > $O/tests_pair.txt 2>&1
mkdir -p $O/t && cp /tmp/ompk-out/summary.txt $O/t/ 2>/dev/null
for f in /tmp/ompk-out/test_router_*.log; do grep -a -E "FAIL|Assert|got|expected" $f | head -5; done > $O/t/fails.txt 2>&1
# kernel names carry the source line of the region in src/target/router_topk.c (rt_fwd_bare):
# l861 pair bf16, l863 pair f32, l865 default N <= 64 k <= 11
for kn in l865 l863 l861; do
    env LD_LIBRARY_PATH=$LIBS OMP_TARGET_OFFLOAD=MANDATORY timeout 20 ncu -k regex:rt_fwd_bare_$kn -c 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats .carry/router2/bin/ompk-bench --backend gpu --filter router_topk_fwd --reps 1 > $O/ncu_$kn.txt 2>&1
done
grep -E "^(gpu|host) " $O/bench.txt
echo "-- tests (OMPK_ROUTER_VARIANT=pair)"; tail -8 $O/tests_pair.txt; head -20 $O/t/fails.txt
for kn in l865 l863 l861; do echo "-- ncu $kn"; grep -E "rt_fwd_bare|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|No Eligible" $O/ncu_$kn.txt | head -10; done
tar -C $O -czf $O/extra.tgz b t 2>/dev/null && rm -rf $O/b $O/t

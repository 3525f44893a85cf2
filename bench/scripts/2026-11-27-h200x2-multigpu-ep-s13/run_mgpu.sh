#!/usr/bin/env bash
# device side: multi-GPU check, the expert-parallel benchmark (forward and fine-tuning step) and
# the single layer's forward for comparison (session 13, second run)
set -u
xz -dk .carry/mgpu/multi_gpu_check.xz
mkdir -p /tmp/ompk-rt && tar -C /tmp/ompk-rt -xJf .carry/runtime/runtime.tar.xz
bash .carry/s13c/run_host.sh /tmp/ompk-host >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{ nvidia-smi -L; nproc; lscpu | grep -E "Model name|^CPU\(s\)|Core\(s\)|Socket|NUMA node\(s\)|Thread"; mpirun --version | head -1; } > $OUT/machine.txt 2>&1
RT="/tmp/ompk-rt:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu"
H="/tmp/ompk-host/lib:$PWD/.carry/mgpu/lib"
echo "== multi_gpu_check, mpirun -np 2" > $OUT/multi_gpu.txt
timeout 300 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$RT:$PWD/.carry/mgpu/lib -x OMP_TARGET_OFFLOAD=MANDATORY .carry/mgpu/multi_gpu_check >> $OUT/multi_gpu.txt 2>&1
echo "exit $?" >> $OUT/multi_gpu.txt
for step in fwd train; do
  for shape in "64 2048 1408 6 4096" "128 2048 768 8 1024"; do
    e=${shape%% *}
    for np in 1 2 4; do
        pe=$((16 / np))
        timeout 200 mpirun -np $np --bind-to core --map-by slot:PE=$pe -x LD_LIBRARY_PATH=$H \
            .carry/mgpu/bench_moe_ep $shape bf16 7 $pe $step --json $OUT/ep-$step-E$e-np$np.json 2>&1
    done
  done
done > $OUT/ep.txt
LD_LIBRARY_PATH=/tmp/ompk-host/lib OMP_NUM_THREADS=16 OMP_PLACES=cores OMP_PROC_BIND=close timeout 200 /tmp/ompk-host/bin/ompk-bench --backend host --filter moe_fwd --reps 7 > $OUT/moe_fwd.txt 2>&1
cat $OUT/machine.txt $OUT/multi_gpu.txt $OUT/ep.txt; grep -E "moe_fwd " $OUT/moe_fwd.txt | head -4

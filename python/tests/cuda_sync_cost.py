"""What the stream ordering costs per ompk op on CUDA (run by hand on a GPU machine):
    OMPK_LIBRARY=build/libompk.so python python/tests/cuda_sync_cost.py
Times one small ompk op (mHC post, B1 S16 n4 D512) per call with the wait on and off, the stream
idle before each call, and the bare torch.cuda.current_stream().synchronize() of an idle stream."""
import time

import torch

import ompk.torch as ot


def per_call(fn, reps=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def main():
    dev = torch.device("cuda")
    x = torch.randn(1, 16, 4, 512, device=dev)
    comb, post = torch.rand(1, 16, 4, 4, device=dev), torch.rand(1, 16, 4, device=dev)
    f = torch.randn(1, 16, 512, device=dev)
    op = lambda: ot.mhc_post_op(x, comb, post, f)  # noqa: E731
    sync_us = per_call(lambda: torch.cuda.current_stream().synchronize())
    on = per_call(op)
    ot.SYNC = False
    off = per_call(op)
    ot.SYNC = True
    print(f"idle-stream synchronize: {sync_us:.1f} us; mhc_post op with wait {on:.1f} us, "
          f"without {off:.1f} us: ordering costs {on - off:.1f} us per op "
          f"on {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()

"""Timing shared by the PyTorch peer scripts: warm-up, then the median and minimum in ms of
`reps` calls, synchronising the GPU around each so that host clocks measure device work."""
import statistics
import time

import torch


def timeit(fn, dev, reps, warmup):
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts), min(ts)

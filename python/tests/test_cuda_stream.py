"""Ordering with PyTorch's CUDA stream: work PyTorch queues asynchronously right before an ompk op
(writing its input) and right after it (overwriting that input, reading its output) must not race
the op. torch.cuda._sleep holds the stream for tens of milliseconds first, so an op that did not
wait would read the input before PyTorch wrote it. The control turns the wait off and must see
the race, which shows the test can catch one. Skipped without CUDA."""
import pytest
import torch

import ompk.torch as ot
import reference as R
from conftest import cuda_or_skip

SLEEP_CYCLES = 200_000_000  # ~0.1 s at 2 GHz: far longer than the op


def _post_inputs():
    B, S, n, D = 4, 64, 4, 512
    dev = torch.device("cuda")
    src = torch.randn(B, S, n, D, device=dev)
    comb = torch.rand(B, S, n, n, device=dev)
    post = torch.rand(B, S, n, device=dev)
    f = torch.randn(B, S, D, device=dev)
    torch.cuda.synchronize()
    return src, comb, post, f


def _queued_run(src, comb, post, f):
    """x is written by PyTorch behind a sleep, read by ompk, then overwritten by PyTorch."""
    x = torch.zeros_like(src)
    torch.cuda._sleep(SLEEP_CYCLES)
    x.copy_(src)
    out = ot.mhc_post(x, comb, post, f)
    x.fill_(-1.0)
    twice = out * 2
    torch.cuda.synchronize()
    return twice


def _expected(src, comb, post, f):
    return 2 * R.mhc_post(src.double(), comb.double(), post.double(), f.double())


@pytest.mark.parametrize("side_stream", [False, True])
def test_ompk_op_ordered_with_current_stream(side_stream):
    cuda_or_skip()
    args = _post_inputs()
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        got = _queued_run(*args)
    torch.testing.assert_close(got.double(), _expected(*args), rtol=1e-5, atol=1e-5)


def test_control_without_wait_races():
    cuda_or_skip()
    args = _post_inputs()
    ot.SYNC = False
    try:
        with torch.cuda.stream(torch.cuda.Stream()):
            got = _queued_run(*args)
    finally:
        ot.SYNC = True
    assert not torch.allclose(got.double(), _expected(*args), rtol=1e-5, atol=1e-5), \
        "no race without the wait: the ordering test above cannot tell ordered from unordered"


def test_attention_backward_ordered():
    cuda_or_skip()
    dev = torch.device("cuda")
    q0, k0, v0 = (torch.randn(2, 4, 128, 64, device=dev) for _ in range(3))
    torch.cuda.synchronize()
    q, k, v = (torch.zeros_like(t).requires_grad_() for t in (q0, k0, v0))
    torch.cuda._sleep(SLEEP_CYCLES)
    with torch.no_grad():
        for t, t0 in zip((q, k, v), (q0, k0, v0)):
            t.copy_(t0)
    out = ot.attention(q, k, v, mask="causal")
    out.sum().backward()
    ref = [t.detach().double().requires_grad_() for t in (q0, k0, v0)]
    R.attention(*ref, mask="causal").sum().backward()
    for t, r in zip((q, k, v), ref):
        torch.testing.assert_close(t.grad.double(), r.grad, rtol=1e-4, atol=1e-4)

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
# libomp's workers spin 200 ms after each ompk call, which starves PyTorch's own OpenMP threads
# on a small machine (README: "PyTorch and ompk on the CPU")
os.environ.setdefault("KMP_BLOCKTIME", "0")

import ompk  # noqa: E402


def _devices():
    devs = ["cpu"]
    if torch.cuda.is_available() and ompk.device_count() > 0:
        devs.append("cuda")
    return devs


def cuda_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    if ompk.device_count() == 0:
        pytest.skip("libompk sees no offload device (host-only build or no GPU image)")


@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    if request.param == "cuda":
        cuda_or_skip()
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)

"""DLPack both ways (numpy and torch, host and CUDA) and errors as exceptions."""
import pytest
import torch

import ompk
from conftest import cuda_or_skip

np = pytest.importorskip("numpy")


def test_numpy_view_describes_strided_array():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::3]
    v = ompk.view(a)
    assert v.t.ndim == 2 and v.t.dtype == 0 and v.t.device.type == 0
    assert list(v.t.shape[:2]) == [4, 2] and list(v.t.strides[:2]) == [6, 3]
    assert v.t.data == a.__array_interface__["data"][0]


def test_torch_view_keeps_dtype_and_pointer():
    t = torch.zeros(3, 5, dtype=torch.bfloat16)
    v = ompk.view(t)
    assert v.t.dtype == 1 and v.t.data == t.data_ptr()
    assert list(v.t.strides[:2]) == [5, 1]


@pytest.mark.parametrize("consumer", ["numpy", "torch"])
def test_buffer_exports_writable_memory(consumer):
    b = ompk.Buffer((2, 3), "float32")
    arr = np.from_dlpack(b) if consumer == "numpy" else torch.from_dlpack(b)
    arr[:] = 7
    again = np.from_dlpack(b)
    assert again.shape == (2, 3) and (again == 7).all()


def test_buffer_export_released_by_consumer_and_by_dropped_capsule():
    from ompk import _core

    before = len(_core._keep)
    b = ompk.Buffer((4,), "int32")
    t = torch.from_dlpack(b)
    assert len(_core._keep) == before + 1
    del t
    cap = b.__dlpack__()
    del cap
    assert len(_core._keep) == before


def test_error_raises_with_library_message():
    sx = torch.zeros(2, 3)
    with pytest.raises(ompk.OmpkError) as e:
        import ompk.torch as ot

        ot.router_topk(sx, sx, 10)
    assert e.value.name == "OMPK_ERR_INVALID_ARGUMENT"
    assert "k = 10" in str(e.value)


def test_cuda_tensor_maps_to_openmp_device():
    cuda_or_skip()
    for n in range(min(torch.cuda.device_count(), ompk.device_count())):
        t = torch.zeros(4, device=f"cuda:{n}")
        v = ompk.view(t)
        assert v.t.device.type == 1 and v.t.device.id == n and v.t.data == t.data_ptr()
    b = ompk.Buffer((8,), "float32", device=0)
    t = torch.from_dlpack(b)
    assert t.device == torch.device("cuda:0")
    t.fill_(3)
    assert torch.from_dlpack(b).sum().item() == 24

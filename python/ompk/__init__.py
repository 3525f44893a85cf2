"""ompk from Python: a ctypes binding of libompk (no compiled extension) with DLPack tensors.

    import ompk                 # finds libompk.so (OMPK_LIBRARY, next to the package, the loader)
    import ompk.torch           # PyTorch custom ops with autograd (torch.library.custom_op)
"""
from ._core import Buffer, OmpkError, View, call, check, view  # noqa: F401
from ._lib import lib as _lib_handle
from ._lib import path as library_path  # noqa: F401


def version():
    return _lib_handle.ompk_version().decode()


def offload_archs():
    return _lib_handle.ompk_offload_archs().decode()


def device_count():
    """OpenMP offload devices (0 in a host-only build or without a GPU)."""
    return _lib_handle.ompk_device_count()

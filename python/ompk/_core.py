"""Errors, DLPack in and out, and ompk-allocated buffers."""
import ctypes

from . import _lib
from ._lib import lib

HOST, TARGET = 0, 1
F32, BF16, F16, I8, I4, I32, I64 = range(7)
STATUS = {0: "OMPK_OK", 1: "OMPK_ERR_INVALID_ARGUMENT", 2: "OMPK_ERR_DEVICE_MISMATCH",
          3: "OMPK_ERR_OUT_OF_MEMORY", 4: "OMPK_ERR_UNSUPPORTED", 5: "OMPK_ERR_INDEX_OUT_OF_RANGE",
          6: "OMPK_ERR_CACHE_FULL", 7: "OMPK_ERR_CACHE_EMPTY", 8: "OMPK_ERR_RUNTIME"}


class OmpkError(RuntimeError):
    """A non-OK status of a libompk call; .status is the code, .name its OMPK_ERR_* name."""

    def __init__(self, status, message, fn=""):
        self.status = status
        self.name = STATUS.get(status, str(status))
        super().__init__(f"{fn}: {self.name}: {message}" if fn else f"{self.name}: {message}")


def check(status, fn=""):
    if status != 0:
        raise OmpkError(status, (lib.ompk_last_error() or b"").decode(), fn)


def call(name, *args):
    """Calls libompk's `name` and raises OmpkError with its message on a non-OK status."""
    check(getattr(lib, name)(*args), name)


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def _capsule_of(obj):
    # torch.utils.dlpack.to_dlpack never synchronises streams: the ordering with PyTorch's
    # stream is done by the torch layer (ompk.torch), the same way for every tensor.
    mod = type(obj).__module__
    if mod.startswith("torch"):
        import torch.utils.dlpack

        return torch.utils.dlpack.to_dlpack(obj.detach())
    if hasattr(obj, "__dlpack__"):
        return obj.__dlpack__()
    raise TypeError(f"ompk: {type(obj).__name__} does not support DLPack (__dlpack__)")


class View:
    """An ompk_tensor descriptor of a DLPack-exporting array (numpy, torch, ...), borrowing its
    memory; the exported capsule stays alive as long as the view does."""

    __slots__ = ("t", "_capsule")

    def __init__(self, obj):
        self._capsule = _capsule_of(obj)
        ptr = _get_pointer(self._capsule, b"dltensor")
        self.t = _lib.Tensor()
        call("ompk_tensor_from_dlpack", ctypes.cast(ptr, ctypes.POINTER(_lib.DLTensor)),
             ctypes.byref(self.t))

    @property
    def ref(self):
        return ctypes.byref(self.t)


def view(obj):
    """ctypes pointer argument for a tensor, or NULL for None."""
    return None if obj is None else View(obj)


_keep = {}


@_lib.DLDeleter
def _deleter(managed):
    _keep.pop(ctypes.addressof(managed.contents), None)


@_lib.DLDeleterVersioned
def _deleter_versioned(managed):
    _keep.pop(ctypes.addressof(managed.contents), None)


_is_valid = ctypes.pythonapi["PyCapsule_IsValid"]
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_get_raw = ctypes.pythonapi["PyCapsule_GetPointer"]
_get_raw.restype = ctypes.c_void_p
_get_raw.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_gone(capsule):
    # A consumer renames the capsule "used_dltensor" and calls the deleter itself; a capsule
    # dropped unconsumed still holds the name, so its export is released here.
    for name in (b"dltensor", b"dltensor_versioned"):
        if _is_valid(capsule, name):
            _keep.pop(_get_raw(capsule, name), None)


class Buffer:
    """Memory from ompk_malloc on a device (host, or OpenMP device n), shaped as a tensor.
    Exports DLPack (__dlpack__ / __dlpack_device__), so numpy.from_dlpack and torch.from_dlpack
    take it without a copy; the memory is freed when the last user lets go of it."""

    _CODES = {"float32": F32, "bfloat16": BF16, "float16": F16, "int8": I8, "int32": I32,
              "int64": I64}
    _BYTES = {F32: 4, BF16: 2, F16: 2, I8: 1, I32: 4, I64: 8}

    def __init__(self, shape, dtype="float32", device=None):
        self.dev = _lib.Device(HOST, 0) if device is None else _lib.Device(TARGET, int(device))
        code = self._CODES[dtype]
        n = 1
        for s in shape:
            n *= int(s)
        self.ptr = lib.ompk_malloc(self.dev, max(n, 1) * self._BYTES[code])
        if not self.ptr:
            raise OmpkError(3, (lib.ompk_last_error() or b"").decode(), "ompk_malloc")
        self.t = _lib.Tensor()
        self.t.data, self.t.dtype, self.t.ndim, self.t.device = self.ptr, code, len(shape), self.dev
        stride = 1
        for d in reversed(range(len(shape))):
            self.t.shape[d], self.t.strides[d] = int(shape[d]), stride
            stride *= int(shape[d])

    def __del__(self, _free=lib.ompk_free):
        if getattr(self, "ptr", None):
            _free(self.dev, self.ptr)
            self.ptr = None

    def __dlpack_device__(self):
        return (1, 0) if self.dev.type == HOST else (2, self.dev.id)

    def __dlpack__(self, stream=None, max_version=None, **kwargs):
        # ompk's calls are synchronous on return, so there is no pending work to order: the
        # stream argument needs nothing. A DLPack 1.x consumer gets a versioned (writable) capsule.
        if max_version is not None and max_version[0] >= 1:
            m, name = _lib.DLManagedTensorVersioned(), b"dltensor_versioned"
            m.major, m.minor, m.deleter = 1, 0, _deleter_versioned
        else:
            m, name = _lib.DLManagedTensor(), b"dltensor"
            m.deleter = _deleter
        call("ompk_tensor_to_dlpack", ctypes.byref(self.t), ctypes.byref(m.dl_tensor))
        _keep[ctypes.addressof(m)] = (m, self)  # the deleter releases both
        gone = ctypes.cast(_capsule_gone, ctypes.c_void_p)
        return _capsule_new(ctypes.addressof(m), name, gone)

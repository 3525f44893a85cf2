"""ctypes declarations of libompk's public C API (include/ompk/*.h) and the library lookup."""
import ctypes
import ctypes.util
import os
import subprocess

c_i64_p = ctypes.POINTER(ctypes.c_int64)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", c_i64_p),
        ("strides", c_i64_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLDeleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DLDeleter),
]



class DLManagedTensorVersioned(ctypes.Structure):
    pass


DLDeleterVersioned = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("major", ctypes.c_uint32),
    ("minor", ctypes.c_uint32),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DLDeleterVersioned),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]

MAX_NDIM = 8


class Device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_NDIM),
        ("strides", ctypes.c_int64 * MAX_NDIM),
        ("device", Device),
    ]


class MhcParams(ctypes.Structure):
    _fields_ = [
        ("norm_eps", ctypes.c_float),
        ("hc_eps", ctypes.c_float),
        ("post_mult", ctypes.c_float),
        ("sinkhorn_repeat", ctypes.c_int),
        ("sinkhorn_eps", ctypes.c_float),
        ("fuse_sinkhorn", ctypes.c_int),
    ]


class AttentionParams(ctypes.Structure):
    _fields_ = [("scale", ctypes.c_float), ("mask", ctypes.c_int)]


class MoeConfig(ctypes.Structure):
    _fields_ = [
        ("experts", ctypes.c_int64),
        ("hidden", ctypes.c_int64),
        ("intermediate", ctypes.c_int64),
        ("top_k", ctypes.c_int),
        ("max_tokens", ctypes.c_int64),
        ("format", ctypes.c_int),
        ("group_size", ctypes.c_int),
        ("numa", ctypes.c_int),
        ("numa_split", ctypes.c_int),
        ("threads", ctypes.c_int),
        ("no_pin", ctypes.c_int),
        ("isa", ctypes.c_int),
        ("amx_min_rows", ctypes.c_int),
        ("cache_depth", ctypes.c_int),
        ("lora_max_rank", ctypes.c_int),
        ("grad_operands", ctypes.c_int),
    ]


class MoeInfo(ctypes.Structure):
    _fields_ = [
        ("isa", ctypes.c_int),
        ("partitions", ctypes.c_int),
        ("numa_nodes", ctypes.c_int),
        ("threads", ctypes.c_int),
        ("weight_bytes", ctypes.c_size_t),
        ("arena_bytes", ctypes.c_size_t),
        ("cache_bytes", ctypes.c_size_t),
        ("cache_bytes_per_token", ctypes.c_size_t),
        ("cache_entries", ctypes.c_int),
    ]


T_p = ctypes.POINTER(Tensor)


class MoeLora(ctypes.Structure):
    _fields_ = [
        ("rank", ctypes.c_int),
        ("alpha", ctypes.c_float),
        ("gate_a", T_p),
        ("gate_b", T_p),
        ("up_a", T_p),
        ("up_b", T_p),
        ("down_a", T_p),
        ("down_b", T_p),
        ("dropout", ctypes.c_float),
        ("seed", ctypes.c_uint64),
    ]


class MhcPreFwdArgs(ctypes.Structure):
    _fields_ = [
        (name, T_p)
        for name in ("x", "phi", "gamma", "alpha", "bias", "h_in", "h_post", "res_logits", "comb",
                     "h_mix", "inv_rms", "h_pre")
    ]


class MhcPostPreFwdArgs(ctypes.Structure):
    _fields_ = [(name, T_p) for name in ("x", "comb", "post", "f", "x_out")] + [
        ("pre", MhcPreFwdArgs)]


class MhcPreBwdArgs(ctypes.Structure):
    _fields_ = [
        (name, T_p)
        for name in ("x", "phi", "gamma", "alpha", "dh_in", "dh_post", "dh_res", "grad_x_post",
                     "h_mix", "inv_rms", "h_pre", "h_post", "dx", "dphi", "dalpha", "dbias",
                     "dgamma")
    ]


class MoeGrads(ctypes.Structure):
    _fields_ = [
        (name, T_p)
        for name in ("dx", "dw", "gate_da", "gate_db", "up_da", "up_db", "down_da", "down_db",
                     "gate_dw", "up_dw", "down_dw")
    ] + [("accumulate", ctypes.c_int)]


def _candidates():
    env = os.environ.get("OMPK_LIBRARY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.startswith("libompk.so"):
            yield os.path.join(here, name)
    found = ctypes.util.find_library("ompk")
    if found:
        yield found
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "ompk"], capture_output=True,
                                text=True, check=True).stdout.strip()
        if libdir:
            yield os.path.join(libdir, "libompk.so")
    except (OSError, subprocess.CalledProcessError):
        pass


def _load():
    tried = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise ImportError(
        "ompk: libompk.so not found; set OMPK_LIBRARY to its path (e.g. build/libompk.so), "
        "install it where the loader or pkg-config finds it, or copy it next to the package."
        + ("\n  tried: " + "\n  tried: ".join(tried) if tried else ""))


lib, path = _load()

_S = ctypes.c_int
_P = ctypes.c_void_p
_TP = T_p
_sigs = {
    "ompk_version": (ctypes.c_char_p, []),
    "ompk_compiler": (ctypes.c_char_p, []),
    "ompk_offload_archs": (ctypes.c_char_p, []),
    "ompk_status_str": (ctypes.c_char_p, [_S]),
    "ompk_last_error": (ctypes.c_char_p, []),
    "ompk_clear_error": (None, []),
    "ompk_device_count": (ctypes.c_int, []),
    "ompk_tensor_from_dlpack": (_S, [ctypes.POINTER(DLTensor), _TP]),
    "ompk_tensor_to_dlpack": (_S, [_TP, ctypes.POINTER(DLTensor)]),
    "ompk_malloc": (_P, [Device, ctypes.c_size_t]),
    "ompk_free": (None, [Device, _P]),
    "ompk_memcpy": (_S, [_P, Device, _P, Device, ctypes.c_size_t]),
    "ompk_mhc_post_fwd": (_S, [_TP] * 5),
    "ompk_mhc_post_bwd": (_S, [_TP] * 9),
    "ompk_mhc_pre_fwd": (_S, [ctypes.POINTER(MhcPreFwdArgs), ctypes.POINTER(MhcParams)]),
    "ompk_mhc_pre_bwd": (_S, [ctypes.POINTER(MhcPreBwdArgs), ctypes.POINTER(MhcParams)]),
    "ompk_mhc_post_pre_fwd": (_S, [ctypes.POINTER(MhcPostPreFwdArgs),
                                   ctypes.POINTER(MhcParams)]),
    "ompk_mhc_sinkhorn_fwd": (_S, [_TP, _TP, ctypes.POINTER(MhcParams)]),
    "ompk_mhc_sinkhorn_bwd": (_S, [_TP, _TP, _TP, ctypes.POINTER(MhcParams)]),
    "ompk_attention_fwd": (_S, [_TP] * 5 + [ctypes.POINTER(AttentionParams)]),
    "ompk_attention_bwd": (_S, [_TP] * 9 + [ctypes.POINTER(AttentionParams)]),
    "ompk_router_topk_fwd": (_S, [_TP, _TP, ctypes.c_int64, _TP, _TP]),
    "ompk_router_topk_bwd": (_S, [_TP, _TP, ctypes.c_int64, _TP, _TP]),
    "ompk_moe_create": (_S, [ctypes.POINTER(MoeConfig), ctypes.POINTER(_P)]),
    "ompk_moe_destroy": (None, [_P]),
    "ompk_moe_get_info": (_S, [_P, ctypes.POINTER(MoeInfo)]),
    "ompk_moe_isa_name": (ctypes.c_char_p, [ctypes.c_int]),
    "ompk_moe_load_weights": (_S, [_P, _TP, _TP, _TP]),
    "ompk_moe_get_weights": (_S, [_P, ctypes.c_int, _TP]),
    "ompk_moe_fwd": (_S, [_P, _TP, _TP, _TP, _TP]),
    "ompk_moe_set_lora": (_S, [_P, ctypes.POINTER(MoeLora)]),
    "ompk_moe_fwd_train": (_S, [_P, _TP, _TP, _TP, _TP, ctypes.c_int]),
    "ompk_moe_bwd": (_S, [_P, _TP, ctypes.POINTER(MoeGrads)]),
}
for _name, (_res, _args) in _sigs.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args

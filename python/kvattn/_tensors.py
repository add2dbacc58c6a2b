"""Tensor conventions shared by the wrappers: dtype names, the caller's framework (torch or
numpy) and device, allocation of outputs like the inputs, host copies of index arrays, and the
base-2 LSE. Nothing here computes attention: kernels read the caller's tensors where they lie
(DLPack), and everything semantic is decided in C++."""

from __future__ import annotations

import math
import sys
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from ._errors import InvalidArgumentError, InvalidDTypeError

LOG2E = 1.0 / math.log(2.0)  # natural LSE -> base 2
LN2 = math.log(2.0)

# kvattn's dtype names (the command line's) by every spelling a caller may use.
_DTYPE_NAMES = {
    "float32": "f32", "float": "f32", "f32": "f32", "fp32": "f32",
    "float16": "f16", "half": "f16", "f16": "f16", "fp16": "f16",
    "bfloat16": "bf16", "bf16": "bf16",
    "float8_e4m3fn": "e4m3", "e4m3": "e4m3", "fp8_e4m3": "e4m3",
    "float8_e5m2": "e5m2", "e5m2": "e5m2", "fp8_e5m2": "e5m2",
}
_NUMPY_STORAGE = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "e4m3": np.uint8,
                  "e5m2": np.uint8}


def _torch():
    return sys.modules.get("torch")


def is_torch(x: Any) -> bool:
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def dtype_name(dtype: Any, argument: str = "dtype") -> str:
    """kvattn's name for a torch dtype, a numpy dtype or a FlashInfer dtype string."""
    if dtype is None:
        raise InvalidArgumentError(f"{argument}: a dtype is required")
    t = _torch()
    if t is not None and isinstance(dtype, t.dtype):
        key = str(dtype).removeprefix("torch.")
    elif isinstance(dtype, str):
        key = dtype.removeprefix("torch.")
    else:
        try:
            key = np.dtype(dtype).name
        except TypeError:
            key = str(dtype)
    name = _DTYPE_NAMES.get(key)
    if name is None:
        raise InvalidDTypeError(
            f"{argument} = {dtype!r}: expected float32, float16, bfloat16, float8_e4m3fn or "
            "float8_e5m2 (a torch dtype or its name)")
    return name


def tensor_dtype_name(x: Any) -> Optional[str]:
    """kvattn's dtype name of a tensor, or None for storage-only arrays (numpy uint8/uint16)."""
    if is_torch(x):
        return _DTYPE_NAMES.get(str(x.dtype).removeprefix("torch."))
    return _DTYPE_NAMES.get(np.asarray(x).dtype.name)


def device_of(x: Any) -> str:
    """The kvattn device string of a tensor: "cpu" or "cuda:N"."""
    if is_torch(x):
        d = x.device
        if d.type == "cpu":
            return "cpu"
        if d.type == "cuda":
            return f"cuda:{d.index or 0}"
        raise InvalidArgumentError(f"tensor on device {d}: kvattn runs on cpu and cuda")
    return "cpu"


def current_stream(device: str) -> int:
    """torch's current CUDA stream on `device` (a cudaStream_t as an int) for "cuda:N", else 0.
    kvattn's CUDA backends issue their work on it, as torch's own kernels do."""
    if not device.startswith("cuda"):
        return 0
    t = _torch()
    return int(t.cuda.current_stream(t.device(device)).cuda_stream)


def torch_dtype(name: str):
    t = _torch()
    return {"f32": t.float32, "f16": t.float16, "bf16": t.bfloat16, "e4m3": t.float8_e4m3fn,
            "e5m2": t.float8_e5m2}[name]


def empty(like: Any, shape: Sequence[int], dtype: str) -> Any:
    """An uninitialized tensor of `shape` and kvattn dtype `dtype` in `like`'s framework and
    device (numpy holds bf16 as uint16 and fp8 as uint8)."""
    if is_torch(like):
        return _torch().empty(tuple(shape), dtype=torch_dtype(dtype), device=like.device)
    return np.empty(tuple(shape), dtype=_NUMPY_STORAGE[dtype])


def empty_f32(like: Any, shape: Sequence[int]) -> Any:
    return empty(like, shape, "f32")


def zeros_i32(like: Any, n: int) -> Any:
    if is_torch(like):
        return _torch().zeros(n, dtype=_torch().int32, device=like.device)
    return np.zeros(n, dtype=np.int32)


def host_i32(x: Any, argument: str) -> np.ndarray:
    """A host int32 copy of an index tensor (indptr, indices, last_page_len): plan reads them on
    the host, as FlashInfer's plan does."""
    if x is None:
        raise InvalidArgumentError(f"{argument}: required")
    if is_torch(x):
        x = x.detach()
        if x.device.type != "cpu":
            x = x.cpu()
        if x.dtype.is_floating_point:
            raise InvalidDTypeError(f"{argument}: dtype {x.dtype}: expected an integer tensor")
        arr = x.numpy()
    else:
        arr = np.asarray(x)
        if not np.issubdtype(arr.dtype, np.integer):
            raise InvalidDTypeError(f"{argument}: dtype {arr.dtype}: expected an integer array")
    if arr.ndim != 1:
        raise InvalidArgumentError(f"{argument}: shape {list(arr.shape)}: expected one dimension")
    if arr.size and (arr.min() < -(2**31) or arr.max() >= 2**31):
        raise InvalidArgumentError(f"{argument}: values outside int32")
    return np.ascontiguousarray(arr, dtype=np.int32)


def to_numpy(x: Any) -> np.ndarray:
    """A host numpy array of x (index arithmetic on small arrays, never attention data)."""
    return x.detach().cpu().numpy() if is_torch(x) else np.asarray(x)


def numpy_like(like: Any, arr: np.ndarray) -> Any:
    """arr in like's framework and device."""
    if is_torch(like):
        return _torch().from_numpy(arr).to(like.device)
    return arr


def scale_inplace(x: Any, factor: float) -> None:
    """x *= factor, in x's framework (the LSE's base change)."""
    if is_torch(x):
        x.mul_(factor)
    else:
        np.multiply(x, factor, out=x)


def scaled_copy(x: Any, factor: float) -> Any:
    if is_torch(x):
        return x * factor
    return np.asarray(x, dtype=np.float32) * np.float32(factor)


def as_kernel_array(x: Any) -> Any:
    """What the extension reads: the tensor itself (DLPack), fp8 torch tensors included."""
    return x


def _expand_4d(x: Any, kv_layout: str) -> Any:
    """FlashInfer's page_size-1 form: a 3-D K or V cache [P, H, D] of a (k, v) tuple is the
    4-D cache with one slot per page ([P, 1, H, D] NHD, [P, H, 1, D] HND), as a view."""
    if len(x.shape) != 3:
        return x
    axis = 1 if kv_layout == "NHD" else 2
    return x.unsqueeze(axis) if is_torch(x) else np.expand_dims(x, axis)


def split_paged_kv_cache(paged_kv_cache: Union[Any, Tuple[Any, Any]], kv_layout: str,
                         argument: str = "paged_kv_cache") -> Tuple[Any, Any]:
    """(k_cache, v_cache) views of FlashInfer's cache forms: a tuple, or one tensor
    [P, 2, page_size, H, D] (NHD) / [P, 2, H, page_size, D] (HND). Views, never copies."""
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise InvalidArgumentError(
                f"{argument}: a tuple of {len(paged_kv_cache)} tensors: expected (k_cache, "
                "v_cache)")
        return (_expand_4d(paged_kv_cache[0], kv_layout),
                _expand_4d(paged_kv_cache[1], kv_layout))
    shape = tuple(paged_kv_cache.shape)
    if len(shape) != 5 or shape[1] != 2:
        raise InvalidArgumentError(
            f"{argument}: shape {list(shape)}: expected [num_pages, 2, page_size, num_kv_heads, "
            f"head_dim] ({kv_layout}: [num_pages, 2, ...]) or a tuple (k_cache, v_cache)")
    return paged_kv_cache[:, 0], paged_kv_cache[:, 1]


def cache_tensors(paged_kv_cache: Union[Any, Tuple[Any, Any]], kv_layout: str = "NHD") -> dict:
    """The run arguments of FlashInfer's cache forms: a (k, v) tuple (each 4-D, or 3-D
    [P, H, D] for page_size 1, as SGLang's token pool passes them), or one [P, 2, ...] tensor
    that the extension splits into K and V views itself (no slicing per call)."""
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise InvalidArgumentError(
                f"paged_kv_cache: a tuple of {len(paged_kv_cache)} tensors: expected (k_cache, "
                "v_cache)")
        return {"paged_k_cache": _expand_4d(paged_kv_cache[0], kv_layout),
                "paged_v_cache": _expand_4d(paged_kv_cache[1], kv_layout)}
    return {"paged_kv_cache": paged_kv_cache}


def check_dtype(x: Any, expected: str, argument: str) -> None:
    """run refuses tensors whose dtype differs from the plan (numpy storage arrays pass: their
    dtype is the plan's by definition)."""
    got = tensor_dtype_name(x)
    if is_torch(x) or got is not None:
        if got != expected and not (not is_torch(x) and _storage_matches(x, expected)):
            raise InvalidDTypeError(
                f"{argument}: dtype {getattr(x, 'dtype', None)} differs from the planned "
                f"{expected} (plan again for another dtype)")
    elif not _storage_matches(x, expected):
        raise InvalidDTypeError(
            f"{argument}: dtype {getattr(x, 'dtype', None)} cannot hold the planned {expected}")


def _storage_matches(x: Any, expected: str) -> bool:
    return np.asarray(x).dtype == np.dtype(_NUMPY_STORAGE[expected])


def check_device(x: Any, device: str, argument: str) -> None:
    got = device_of(x)
    if got != device and not (device.startswith("cuda") and got.startswith("cuda") and
                              device.split(":")[-1] == got.split(":")[-1]):
        raise InvalidArgumentError(
            f"{argument}: on device {got}, the plan was made for {device} (plan again, or move "
            "the tensor)")


def check_shape(x: Any, expected: Sequence[int], argument: str, meaning: str) -> None:
    if tuple(x.shape) != tuple(expected):
        raise InvalidArgumentError(
            f"{argument}: shape {list(x.shape)}: expected {list(expected)} ({meaning})")

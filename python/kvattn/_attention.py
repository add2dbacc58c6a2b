"""What the attention wrappers share: turning FlashInfer-style arguments into the problem's
parameters (the library's names, typed values: the extension's `Problem`), planning through the
extension, and running a plan on the caller's tensors
(outputs allocated like the input, or written into `out=` / `lse=`; the LSE in base 2 unless
asked otherwise)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import _kvattn
from ._errors import InvalidArgumentError, NotSupportedError
from ._tensors import current_stream, device_of, dtype_name, empty, empty_f32, numpy_like

BACKENDS = ("auto",) + tuple(_kvattn.backend_names())


def problem_fields(**fields: Any) -> Dict[str, Any]:
    """Keyword problem parameters, None (unset) left out: the keys of the library's problem table
    with values of their own types (bool, int, float, str), as `_kvattn.Problem` takes them."""
    return {k: v for k, v in fields.items() if v is not None}


def check_backend(backend: str) -> str:
    """The backend name, or C++'s InvalidArgumentError naming the registered ones."""
    _kvattn.check_backend(backend)
    return backend


def check_pos_encoding_mode(mode: str) -> str:
    """The mode, or the problem table's refusal (C++)."""
    _kvattn.check_field("pos_encoding_mode", mode)
    return mode


def check_kv_layout(kv_layout: str) -> str:
    """The layout, or the problem table's refusal (C++)."""
    _kvattn.check_field("kv_layout", kv_layout)
    return kv_layout


def soft_cap(logits_soft_cap: Optional[float]) -> float:
    return 0.0 if logits_soft_cap is None else float(logits_soft_cap)


def unsupported(argument: str, why: str) -> NotSupportedError:
    return NotSupportedError(f"{argument}: {why}")


def sinks_tensor(sinks: Any) -> Any:
    """FlashInfer's sinks as kvattn reads them: float32 (another float dtype converts; C++ checks
    the shape, [H_qo])."""
    if sinks is None:
        return None
    if hasattr(sinks, "float"):
        return sinks if str(sinks.dtype) == "torch.float32" else sinks.float()
    return np.ascontiguousarray(sinks, dtype=np.float32)


def scale_caches(kv_cache_sf: Any, kv_layout: str) -> Dict[str, Any]:
    """FlashInfer's per-(token, head) scale tensors (k_sf, v_sf): [P, page_size, H_kv] (NHD) or
    [P, H_kv, page_size] (HND); kvattn addresses them as [P, page_size, H_kv] in both layouts,
    so an HND pair is passed as a transposed view (no copy)."""
    if not isinstance(kv_cache_sf, (tuple, list)) or len(kv_cache_sf) != 2:
        raise InvalidArgumentError("kv_cache_sf: expected a (k_scales, v_scales) tuple of float32 "
                                   "[num_pages, page_size, num_kv_heads] tensors")
    k_sf, v_sf = kv_cache_sf
    if kv_layout == "HND":
        k_sf, v_sf = k_sf.transpose(1, 2), v_sf.transpose(1, 2)
    return {"k_scale_cache": k_sf, "v_scale_cache": v_sf}


def scale_value(value: Any) -> Any:
    """A scale given as a float, or as a tensor whose elements are all equal, as a float (read
    once on the host); a tensor of different values stays a tensor (per KV head: C++ checks its
    shape and values). None stays None."""
    if value is None or isinstance(value, (int, float)):
        return None if value is None else float(value)
    values = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    if flat.size >= 1 and np.all(flat == flat[0]):
        return float(flat[0])
    if hasattr(value, "float"):
        return value.reshape(-1).float()
    return np.ascontiguousarray(flat, dtype=np.float32)


def kv_scales(k_scale: Any, v_scale: Any, num_kv_heads: int, like: Any) -> Tuple[
        Optional[float], Optional[float], Dict[str, Any]]:
    """K/V scales as (k float, v float, {}) when both are one value each, or as (None, None,
    {"k_scale": [H_kv], "v_scale": [H_kv]}) when either differs between heads (per-head scales
    carry both as tensors)."""
    k, v = scale_value(k_scale), scale_value(v_scale)
    if not (hasattr(k, "shape") or hasattr(v, "shape")):
        return k, v, {}
    k = k if hasattr(k, "shape") else filled_f32(like, num_kv_heads, 1.0 if k is None else k)
    v = v if hasattr(v, "shape") else filled_f32(like, num_kv_heads, 1.0 if v is None else v)
    return None, None, {"k_scale": k, "v_scale": v}


def filled_f32(like: Any, n: int, value: float) -> Any:
    """float32 [n] filled with `value`, in like's framework and on its device."""
    return numpy_like(like, np.full(n, value, dtype=np.float32))


class AttentionPlan:
    """A plan made by the extension plus what run needs to shape the outputs."""

    __slots__ = ("ext", "device", "o_dtype", "num_qo_heads", "num_kv_heads", "head_dim_vo",
                 "nnz_qo", "index_tensors", "q_shape_tail")

    def __init__(self, op: str, fields: Dict[str, str], index_tensors: Dict[str, Any],
                 backend: str, device: str, nnz_qo: int, num_threads: int = 0,
                 kv_chunk_size: int = 0, custom_mask_packed: bool = False) -> None:
        problem = _kvattn.Problem(**dict(fields, op=op))
        self.ext = _kvattn.plan(problem, index_tensors, custom_mask_packed, backend, device,
                                num_threads, kv_chunk_size, current_stream(device))
        problem = self.ext.problem
        self.device = device
        self.o_dtype = problem.o_data_type
        self.num_qo_heads = problem.num_qo_heads
        self.num_kv_heads = problem.num_kv_heads
        # MLA's output width is head_dim_ckv (its problem leaves head_dim_vo out)
        self.head_dim_vo = problem.head_dim_vo or problem.head_dim_ckv
        self.nnz_qo = nnz_qo
        self.index_tensors = index_tensors

    @property
    def backend(self) -> str:
        return self.ext.backend

    def run(self, q: Any, tensors: Dict[str, Any], *, out: Any = None, lse: Any = None,
            return_lse: bool = False, lse_base: str = "log2", lse_layout: str = "NH",
            q_scale: Any = None, k_scale: Any = None, v_scale: Any = None, workspace: Any = None,
            out_shape: Optional[Tuple[int, ...]] = None, q_key: str = "q",
            sinks: Any = None) -> Any:
        if self.device != "cpu" and device_of(q) != self.device:
            raise InvalidArgumentError(
                f"q: on device {device_of(q)}, the plan was made for {self.device} (plan again "
                "on this device, or move the tensors)")
        shape = out_shape or (self.nnz_qo, self.num_qo_heads, self.head_dim_vo)
        if out is None:
            out = empty(q, shape, self.o_dtype)
        want_lse = return_lse or lse is not None
        if want_lse and lse is None:
            if lse_layout == "NH":
                lse = empty_f32(q, shape[:-1])
            elif lse_layout == "HN":
                lse = empty_f32(q, shape[-2:-1] + shape[:-2]).T
            else:
                raise InvalidArgumentError(f"lse_layout = {lse_layout!r}: expected NH or HN")
        if lse_base not in ("log2", "ln"):
            raise InvalidArgumentError(f"lse_base = {lse_base!r}: expected log2 or ln")
        if sinks is not None:
            tensors["sinks"] = sinks_tensor(sinks)
        if k_scale is not None or v_scale is not None:
            k_scale, v_scale, head_scale_tensors = kv_scales(k_scale, v_scale, self.num_kv_heads,
                                                             q)
            tensors.update(head_scale_tensors)
        if q_scale is not None:
            q_scale = scale_value(q_scale)
        tensors[q_key] = q
        tensors["out"] = out
        if want_lse:
            tensors["lse"] = lse
        # The kernels write the LSE in the asked base (no second pass over it here).
        _kvattn.run(self.ext, tensors, workspace, lse_base == "log2", q_scale, k_scale, v_scale,
                    0 if self.device == "cpu" else current_stream(self.device))
        if return_lse:
            return out, lse
        return out


def run_once(op: str, fields: Dict[str, str], tensors: Dict[str, Any], backend: str,
             like: Any, out_shape: Tuple[int, ...], return_lse: bool,
             custom_mask_packed: bool = False, q_scale: Any = None, k_scale: Any = None,
             v_scale: Any = None) -> Any:
    """plan + run for the single operations (no plan to reuse; their plan needs every tensor:
    the lengths come from q and k). The scales are run values; the LSE is base 2."""
    problem = _kvattn.Problem(**dict(fields, op=op))
    o_dtype = problem.o_data_type
    out = empty(like, out_shape, o_dtype)
    lse = empty_f32(like, out_shape[:-1]) if return_lse else None
    tensors = dict(tensors, out=out, lse=lse)
    device = device_of(like)
    plan = _kvattn.plan(problem, tensors, custom_mask_packed, backend, device, 0, 0,
                        current_stream(device))
    _kvattn.run(plan, tensors, None, True, q_scale, k_scale, v_scale, current_stream(device))
    if return_lse:
        return out, lse
    return out


def resolve_dtypes(q_data_type: Any, kv_data_type: Any, o_data_type: Any,
                   data_type: Any = None) -> Tuple[str, str, str]:
    """FlashInfer's dtype defaults: kv follows q, o follows q (bf16 for an fp8 q). The
    deprecated data_type only fills q_data_type / kv_data_type where they are left unset (None),
    as FlashInfer's decode plan does; an explicit dtype always wins."""
    if data_type is not None:
        if q_data_type is None:
            q_data_type = data_type
        if kv_data_type is None:
            kv_data_type = data_type
    q = dtype_name(q_data_type, "q_data_type")
    kv = dtype_name(kv_data_type, "kv_data_type") if kv_data_type is not None else q
    if o_data_type is not None:
        o = dtype_name(o_data_type, "o_data_type")
    else:
        o = "bf16" if q in ("e4m3", "e5m2") else q
    return q, kv, o

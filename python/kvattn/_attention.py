"""What the attention wrappers share: turning FlashInfer-style arguments into the command line's
problem fields, planning through the extension, and running a plan on the caller's tensors
(outputs allocated like the input, or written into `out=` / `lse=`; the LSE in base 2 unless
asked otherwise)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import _kvattn
from ._errors import InvalidArgumentError, NotSupportedError
from ._tensors import (LOG2E, current_stream, device_of, dtype_name, empty, empty_f32,
                       scale_inplace)

BACKENDS = ("auto", "cpu", "reference", "fa2", "fa3")


def field_text(value: Any) -> str:
    """A problem value as the command line writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def problem_fields(**fields: Any) -> Dict[str, str]:
    """Keyword problem parameters (None = unset) as the extension's field dictionary."""
    return {k: field_text(v) for k, v in fields.items() if v is not None}


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise InvalidArgumentError(
            f"backend = {backend!r}: expected one of {', '.join(BACKENDS)}")
    return backend


def check_pos_encoding_mode(mode: str) -> str:
    if mode not in ("NONE", "ROPE_LLAMA", "ALIBI"):
        raise InvalidArgumentError(
            f"pos_encoding_mode = {mode!r}: expected NONE, ROPE_LLAMA or ALIBI")
    return mode


def check_kv_layout(kv_layout: str) -> str:
    if kv_layout not in ("NHD", "HND"):
        raise InvalidArgumentError(f"kv_layout = {kv_layout!r}: expected NHD or HND")
    return kv_layout


def soft_cap(logits_soft_cap: Optional[float]) -> float:
    return 0.0 if logits_soft_cap is None else float(logits_soft_cap)


def unsupported(argument: str, why: str) -> NotSupportedError:
    return NotSupportedError(f"{argument}: {why}")


def sinks_tensor(sinks: Any, num_qo_heads: int) -> Any:
    """FlashInfer's sinks [H_qo] as kvattn reads them: float32 (a [H_qo] vector converts)."""
    if sinks is None:
        return None
    if tuple(sinks.shape) != (num_qo_heads,):
        raise InvalidArgumentError(
            f"sinks: shape {list(sinks.shape)}: expected [{num_qo_heads}] (one logit per query "
            "head)")
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


def head_scales(value: Any, argument: str) -> Tuple[Optional[float], Any]:
    """A K or V scale as (per-tensor float, None) when it is one value, or (None, float32 [H_kv]
    tensor) when it differs between heads (kv_scale_granularity per_head)."""
    if value is None or isinstance(value, (int, float)):
        return (None if value is None else float(value)), None
    values = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    if flat.size >= 1 and np.all(flat == flat[0]):
        return float(flat[0]), None
    if hasattr(value, "float"):
        return None, value.reshape(-1).float()
    return None, np.ascontiguousarray(flat, dtype=np.float32)


def float_scale(value: Any, argument: str) -> Optional[float]:
    """A per-tensor scale given as a float, or as a tensor whose elements are all equal (a
    per-head scale that is the same for every head is a per-tensor scale). None stays None."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    values = value.detach().cpu().numpy() if hasattr(value, "detach") else value
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    if flat.size >= 1 and np.all(flat == flat[0]):
        return float(flat[0])
    raise unsupported(argument, f"a scale tensor of {flat.size} different values: per-head "
                      "scales are not in this build (a float or equal values)")


class AttentionPlan:
    """A plan made by the extension plus what run needs to shape the outputs."""

    __slots__ = ("ext", "device", "o_dtype", "num_qo_heads", "head_dim_vo", "nnz_qo",
                 "index_tensors", "q_shape_tail")

    def __init__(self, op: str, fields: Dict[str, str], index_tensors: Dict[str, Any],
                 backend: str, device: str, nnz_qo: int, num_threads: int = 0,
                 kv_chunk_size: int = 0, custom_mask_packed: bool = False) -> None:
        fields = dict(fields, op=op)
        self.ext = _kvattn.plan(fields, index_tensors, custom_mask_packed, check_backend(backend),
                                device, num_threads, kv_chunk_size, current_stream(device))
        problem = self.ext.problem
        self.device = device
        self.o_dtype = problem["o_data_type"]
        self.num_qo_heads = int(problem["num_qo_heads"])
        # MLA's output width is head_dim_ckv (its problem leaves head_dim_vo out)
        self.head_dim_vo = int(problem.get("head_dim_vo") or problem["head_dim_ckv"])
        self.nnz_qo = nnz_qo
        self.index_tensors = index_tensors

    @property
    def backend(self) -> str:
        return self.ext.backend

    def run(self, q: Any, tensors: Dict[str, Any], *, out: Any = None, lse: Any = None,
            return_lse: bool = False, lse_base: str = "log2", lse_layout: str = "NH",
            q_scale: Optional[float] = None, k_scale: Optional[float] = None,
            v_scale: Optional[float] = None, workspace: Any = None,
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
            tensors["sinks"] = sinks_tensor(sinks, self.num_qo_heads)
        tensors[q_key] = q
        tensors["out"] = out
        if want_lse:
            tensors["lse"] = lse
        _kvattn.run(self.ext, tensors, workspace, want_lse, q_scale, k_scale, v_scale,
                    current_stream(self.device))
        if want_lse and lse_base == "log2":
            scale_inplace(lse, LOG2E)
        if return_lse:
            return out, lse
        return out


def run_once(op: str, fields: Dict[str, str], tensors: Dict[str, Any], backend: str,
             like: Any, out_shape: Tuple[int, ...], return_lse: bool,
             custom_mask_packed: bool = False) -> Any:
    """plan + run for the single operations (no plan to reuse; their plan needs every tensor:
    the lengths come from q and k)."""
    fields = dict(fields, op=op, return_lse=field_text(return_lse))
    o_dtype = _kvattn.problem(fields)["o_data_type"]
    out = empty(like, out_shape, o_dtype)
    lse = empty_f32(like, out_shape[:-1]) if return_lse else None
    tensors = dict(tensors, out=out, lse=lse)
    device = device_of(like)
    plan = _kvattn.plan(fields, tensors, custom_mask_packed, check_backend(backend), device, 0, 0,
                        current_stream(device))
    _kvattn.run(plan, tensors, None, return_lse, None, None, None, current_stream(device))
    if return_lse:
        scale_inplace(lse, LOG2E)
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

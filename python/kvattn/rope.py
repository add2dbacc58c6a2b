"""Rotary position embedding on q and k outside attention (flashinfer.rope): positions from a
ragged indptr + offsets or given per token, Llama 3.1 frequency scaling, a precomputed cos/sin
cache. The rotation itself is kvattn's C++ apply_rope."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _kvattn
from ._attention import unsupported
from ._errors import InvalidArgumentError
from ._tensors import current_stream, device_of, is_torch, numpy_like, to_numpy


def _positions(indptr: Any, offsets: Any, nnz: int, like: Any) -> Any:
    """Token i of request b sits at offsets[b] + (i - indptr[b])."""
    ind = to_numpy(indptr).astype(np.int64)
    off = to_numpy(offsets).astype(np.int64)
    if ind.ndim != 1 or len(ind) != len(off) + 1:
        raise InvalidArgumentError(
            f"indptr: {len(ind)} entries, offsets: {len(off)}: expected B+1 and B")
    if len(ind) == 0 or ind[0] != 0 or np.any(np.diff(ind) < 0) or ind[-1] != nnz:
        raise InvalidArgumentError(
            f"indptr must start at 0, be non-decreasing and end at nnz = {nnz}")
    counts = np.diff(ind)
    b = np.repeat(np.arange(len(off)), counts)
    pos = off[b] + np.arange(nnz, dtype=np.int64) - ind[:-1][b]
    return numpy_like(like, pos.astype(np.int32))


def _pos_ids(pos_ids: Any, like: Any) -> Any:
    if is_torch(pos_ids) and str(pos_ids.dtype) == "torch.int32":
        return pos_ids
    return numpy_like(like, np.ascontiguousarray(to_numpy(pos_ids), dtype=np.int32))


def _rotate(q: Any, k: Any, q_out: Any, k_out: Any, pos_ids: Any, rotary_dim: Optional[int],
            interleave: bool, rope_scale: float, rope_theta: float,
            llama31: Optional[Tuple[float, float, float]] = None,
            cos_sin_cache: Any = None) -> None:
    _kvattn.apply_rope(q, k, q_out, k_out, pos_ids, float(rope_theta), float(rope_scale),
                       bool(interleave), 0 if rotary_dim is None else int(rotary_dim), llama31,
                       cos_sin_cache, "auto", device_of(q), 0,
                       current_stream(device_of(q)))


def _empty_like(x: Any) -> Any:
    return x.new_empty(x.shape) if is_torch(x) else np.empty_like(x)


def apply_rope_pos_ids_inplace(q: Any, k: Any, pos_ids: Any, rotary_dim: Optional[int] = None,
                               interleave: bool = False, rope_scale: float = 1,
                               rope_theta: float = 1e4) -> None:
    """Rotates q [nnz, H_qo, D] and k [nnz, H_kv, D] in place at positions pos_ids [nnz]."""
    _rotate(q, k, q, k, _pos_ids(pos_ids, q), rotary_dim, interleave, rope_scale, rope_theta)


def apply_rope_pos_ids(q: Any, k: Any, pos_ids: Any, rotary_dim: Optional[int] = None,
                       interleave: bool = False, rope_scale: float = 1,
                       rope_theta: float = 1e4) -> Tuple[Any, Any]:
    """Returns (q_rope, k_rope): q and k rotated at positions pos_ids [nnz]."""
    q_out, k_out = _empty_like(q), _empty_like(k)
    _rotate(q, k, q_out, k_out, _pos_ids(pos_ids, q), rotary_dim, interleave, rope_scale,
            rope_theta)
    return q_out, k_out


def apply_rope_inplace(q: Any, k: Any, indptr: Any, offsets: Any,
                       rotary_dim: Optional[int] = None, interleave: bool = False,
                       rope_scale: float = 1, rope_theta: float = 1e4) -> None:
    """Rotates ragged q, k in place: request b's tokens indptr[b]..indptr[b+1] sit at positions
    offsets[b], offsets[b] + 1, ..."""
    pos = _positions(indptr, offsets, q.shape[0], q)
    _rotate(q, k, q, k, pos, rotary_dim, interleave, rope_scale, rope_theta)


def apply_rope(q: Any, k: Any, indptr: Any, offsets: Any, rotary_dim: Optional[int] = None,
               interleave: bool = False, rope_scale: float = 1,
               rope_theta: float = 1e4) -> Tuple[Any, Any]:
    """Returns (q_rope, k_rope) for ragged q, k (see apply_rope_inplace)."""
    pos = _positions(indptr, offsets, q.shape[0], q)
    q_out, k_out = _empty_like(q), _empty_like(k)
    _rotate(q, k, q_out, k_out, pos, rotary_dim, interleave, rope_scale, rope_theta)
    return q_out, k_out


def apply_llama31_rope_pos_ids_inplace(q: Any, k: Any, pos_ids: Any,
                                       rotary_dim: Optional[int] = None,
                                       interleave: bool = False, rope_scale: float = 8,
                                       rope_theta: float = 5e5, low_freq_factor: float = 1,
                                       high_freq_factor: float = 4,
                                       old_context_len: int = 8192) -> None:
    """apply_rope_pos_ids_inplace with Llama 3.1's frequency scaling."""
    _rotate(q, k, q, k, _pos_ids(pos_ids, q), rotary_dim, interleave, rope_scale, rope_theta,
            (float(low_freq_factor), float(high_freq_factor), float(old_context_len)))


def apply_llama31_rope_pos_ids(q: Any, k: Any, pos_ids: Any, rotary_dim: Optional[int] = None,
                               interleave: bool = False, rope_scale: float = 8,
                               rope_theta: float = 5e5, low_freq_factor: float = 1,
                               high_freq_factor: float = 4,
                               old_context_len: int = 8192) -> Tuple[Any, Any]:
    """apply_rope_pos_ids with Llama 3.1's frequency scaling."""
    q_out, k_out = _empty_like(q), _empty_like(k)
    _rotate(q, k, q_out, k_out, _pos_ids(pos_ids, q), rotary_dim, interleave, rope_scale,
            rope_theta, (float(low_freq_factor), float(high_freq_factor), float(old_context_len)))
    return q_out, k_out


def apply_llama31_rope_inplace(q: Any, k: Any, indptr: Any, offsets: Any,
                               rotary_dim: Optional[int] = None, interleave: bool = False,
                               rope_scale: float = 8, rope_theta: float = 5e5,
                               low_freq_factor: float = 1, high_freq_factor: float = 4,
                               old_context_len: int = 8192) -> None:
    """apply_rope_inplace with Llama 3.1's frequency scaling."""
    pos = _positions(indptr, offsets, q.shape[0], q)
    _rotate(q, k, q, k, pos, rotary_dim, interleave, rope_scale, rope_theta,
            (float(low_freq_factor), float(high_freq_factor), float(old_context_len)))


def apply_llama31_rope(q: Any, k: Any, indptr: Any, offsets: Any,
                       rotary_dim: Optional[int] = None, interleave: bool = False,
                       rope_scale: float = 8, rope_theta: float = 5e5,
                       low_freq_factor: float = 1, high_freq_factor: float = 4,
                       old_context_len: int = 8192) -> Tuple[Any, Any]:
    """apply_rope with Llama 3.1's frequency scaling."""
    pos = _positions(indptr, offsets, q.shape[0], q)
    q_out, k_out = _empty_like(q), _empty_like(k)
    _rotate(q, k, q_out, k_out, pos, rotary_dim, interleave, rope_scale, rope_theta,
            (float(low_freq_factor), float(high_freq_factor), float(old_context_len)))
    return q_out, k_out


def _heads(x: Any, head_size: int, argument: str) -> Any:
    """[nnz, H * head_size] (vLLM's flattened form) or [nnz, H, head_size] as a 3-D view."""
    if len(x.shape) == 3:
        return x
    if len(x.shape) != 2 or x.shape[1] % head_size:
        raise InvalidArgumentError(
            f"{argument}: shape {list(x.shape)}: expected [nnz, num_heads * head_size "
            f"({head_size})] or [nnz, num_heads, head_size]")
    return x.reshape(x.shape[0], x.shape[1] // head_size, head_size)


def apply_rope_with_cos_sin_cache(positions: Any, query: Any, key: Any, head_size: int,
                                  cos_sin_cache: Any, is_neox: bool = True) -> Tuple[Any, Any]:
    """Rotates query/key ([nnz, H * head_size]) with cos/sin read from cos_sin_cache
    [max_position, rotary_dim] (f32: cos in the first half, sin in the second) at `positions`;
    is_neox=True rotates halves, False interleaved pairs. Returns (query_out, key_out)."""
    q_out, k_out = _empty_like(query), _empty_like(key)
    _rotate(_heads(query, head_size, "query"), _heads(key, head_size, "key"),
            _heads(q_out, head_size, "query"), _heads(k_out, head_size, "key"),
            _pos_ids(positions, query), None, not is_neox, 1.0, 1e4, None, cos_sin_cache)
    return q_out, k_out


def apply_rope_with_cos_sin_cache_inplace(positions: Any, query: Any, key: Any, head_size: int,
                                          cos_sin_cache: Any, is_neox: bool = True) -> None:
    """apply_rope_with_cos_sin_cache, in place."""
    qh, kh = _heads(query, head_size, "query"), _heads(key, head_size, "key")
    _rotate(qh, kh, qh, kh, _pos_ids(positions, query), None, not is_neox, 1.0, 1e4, None,
            cos_sin_cache)


# ---- fused RoPE + FP8 quantization [+ append] (FlashInfer's rope_quantize_fp8 family) ----
# Built from kvattn's parts: the rotation is kvattn's apply_rope with a cos/sin cache (into
# float32), the quantization is x * quant_scale rounded to nearest even and saturated to the
# FP8 range (FlashInfer's satfinite cast), and the append is kvattn's append_paged_kv_cache /
# append_paged_mla_kv_cache (which rounds the same way, and skips batch index -1 rows).

_FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def _fp8_dtype(quantize_dtype: Any, outs: Tuple[Any, ...]) -> Any:
    import torch
    if quantize_dtype is None:
        quantize_dtype = next((o.dtype for o in outs if o is not None), torch.float8_e4m3fn)
    if str(quantize_dtype).removeprefix("torch.") not in _FP8_MAX:
        raise InvalidArgumentError(f"quantize_dtype = {quantize_dtype}: must be "
                                   "torch.float8_e4m3fn or torch.float8_e5m2")
    return quantize_dtype


def _quantize_into(x32: Any, scale: float, dtype: Any, out: Any, argument: str) -> Any:
    """out = fp8(x32 * scale), round to nearest even, saturating (allocated if None)."""
    fmax = _FP8_MAX[str(dtype).removeprefix("torch.")]
    q = (x32 * float(scale)).clamp_(-fmax, fmax).to(dtype)
    if out is None:
        return q
    if tuple(out.shape) != tuple(q.shape) or out.dtype != dtype:
        raise InvalidArgumentError(f"{argument}: shape {list(out.shape)}, dtype {out.dtype}: "
                                   f"must be {list(q.shape)}, {dtype}")
    out.copy_(q)
    return out


def _rotated_f32(q_rope: Any, k_rope3: Any, cos_sin_cache: Any, pos_ids: Any,
                 is_neox: bool) -> Tuple[Any, Any]:
    import torch
    if str(cos_sin_cache.dtype) != "torch.float32":
        raise InvalidArgumentError(f"cos_sin_cache: dtype {cos_sin_cache.dtype}: must be "
                                   "float32")
    q32 = torch.empty(q_rope.shape, dtype=torch.float32, device=q_rope.device)
    k32 = torch.empty(k_rope3.shape, dtype=torch.float32, device=k_rope3.device)
    _rotate(q_rope, k_rope3, q32, k32, _pos_ids(pos_ids, q_rope), None, not is_neox, 1.0, 1e4,
            None, cos_sin_cache)
    return q32, k32


def rope_quantize_fp8(q_rope: Any, k_rope: Any, q_nope: Any, k_nope: Any, cos_sin_cache: Any,
                      pos_ids: Any, is_neox: bool = True, quantize_dtype: Any = None,
                      quant_scale_q: float = 1.0, quant_scale_kv: float = 1.0,
                      q_rope_out: Any = None, k_rope_out: Any = None, q_nope_out: Any = None,
                      k_nope_out: Any = None, enable_pdl: bool = False,
                      backend: str = "cuda") -> Tuple[Any, Any, Any, Any]:
    """RoPE on q_rope [nnz, H_qo, R] and k_rope ([nnz, H_kv, R], or MLA's [nnz, R]) with
    cos/sin from cos_sin_cache [max_pos, R] (f32) at pos_ids, then everything (q_nope / k_nope,
    None = zero-width) quantized to FP8: out = fp8(x * quant_scale_{q,kv}). Returns
    (q_rope_out, k_rope_out, q_nope_out, k_nope_out). backend "cuda" (FlashInfer's default
    name) runs kvattn's RoPE on whatever device the tensors are on."""
    import torch
    if backend == "cutile":
        raise unsupported("backend", "'cutile': FlashInfer's cuda.tile kernel is not "
                               "kvattn's (backend='cuda' runs kvattn's RoPE)")
    if backend != "cuda":
        raise InvalidArgumentError(f"backend = {backend!r}: expected 'cuda' or 'cutile'")
    dtype = _fp8_dtype(quantize_dtype, (q_rope_out, k_rope_out, q_nope_out, k_nope_out))
    nnz, heads = q_rope.shape[0], q_rope.shape[1]
    is_mla = len(k_rope.shape) == 2
    k3 = k_rope.unsqueeze(1) if is_mla else k_rope
    if q_nope is None:
        q_nope = q_rope.new_empty((nnz, heads, 0))
    if k_nope is None:
        k_nope = k_rope.new_empty((nnz, 0) if is_mla else (nnz, k3.shape[1], 0))
    q32, k32 = _rotated_f32(q_rope, k3, cos_sin_cache, pos_ids, is_neox)
    if is_mla:
        k32 = k32.squeeze(1)
    return (_quantize_into(q32, quant_scale_q, dtype, q_rope_out, "q_rope_out"),
            _quantize_into(k32, quant_scale_kv, dtype, k_rope_out, "k_rope_out"),
            _quantize_into(q_nope.float(), quant_scale_q, dtype, q_nope_out, "q_nope_out"),
            _quantize_into(k_nope.float(), quant_scale_kv, dtype, k_nope_out, "k_nope_out"))


def mla_rope_quantize_fp8(q_rope: Any, k_rope: Any, q_nope: Any, k_nope: Any,
                          cos_sin_cache: Any, pos_ids: Any, is_neox: bool = True,
                          quantize_dtype: Any = None, quant_scale_q: float = 1.0,
                          quant_scale_kv: float = 1.0, q_rope_out: Any = None,
                          k_rope_out: Any = None, q_nope_out: Any = None,
                          k_nope_out: Any = None,
                          enable_pdl: bool = False) -> Tuple[Any, Any, Any, Any]:
    """rope_quantize_fp8 with MLA's layout: k_rope [nnz, R] and k_nope [nnz, D_ckv]."""
    return rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox,
                             quantize_dtype, quant_scale_q, quant_scale_kv, q_rope_out,
                             k_rope_out, q_nope_out, k_nope_out, enable_pdl)


def rope_quantize_fp8_append_paged_kv_cache(
        q_rope: Any, k_rope: Any, q_nope: Any, k_nope: Any, v: Any, cos_sin_cache: Any,
        pos_ids: Any, paged_kv_cache: Tuple[Any, Any], kv_indices: Any, kv_indptr: Any,
        batch_indices: Any, positions: Any, is_neox: bool = True, quantize_dtype: Any = None,
        quant_scale_q: float = 1.0, quant_scale_kv: float = 1.0, page_size: int = 16,
        kv_layout: str = "NHD", q_rope_out: Any = None, q_nope_out: Any = None,
        enable_pdl: bool = False) -> Tuple[Any, Any]:
    """rope_quantize_fp8, then the quantized K (and V) appended to the FP8 paged cache at
    (batch_indices[i], positions[i]) (batch index -1: a padded row, written nowhere).
    GQA/MHA (k_rope 3-D): paged_kv_cache = (k_cache, v_cache), K stored as [rotated k_rope,
    k_nope] along the head dim; MLA (k_rope 2-D, v None): (ckv_cache, kpe_cache) take k_nope
    and the rotated k_rope. Every page of kv_indptr's requests counts as full (FlashInfer's op
    takes no last_page_len). Returns (q_rope_out, q_nope_out)."""
    import numpy as np
    import torch
    from .page import append_paged_kv_cache, append_paged_mla_kv_cache
    if not isinstance(paged_kv_cache, (tuple, list)) or len(paged_kv_cache) != 2:
        raise InvalidArgumentError("paged_kv_cache: must be a tuple of 2 tensors "
                                   "((k_cache, v_cache), or MLA's (ckv_cache, kpe_cache))")
    dtype = _fp8_dtype(quantize_dtype, (q_rope_out, q_nope_out))
    cache_0, cache_1 = paged_kv_cache
    for name, c in (("paged_kv_cache[0]", cache_0), ("paged_kv_cache[1]", cache_1)):
        if c.dtype != dtype:
            raise InvalidArgumentError(f"{name}: dtype {c.dtype}: must be quantize_dtype "
                                       f"{dtype}")
    # A padded row (batch index -1) is written nowhere and its q outputs are unspecified (as in
    # FlashInfer, which skips it): its pos_ids entry is not read (rotated at position 0).
    padded = torch.as_tensor(to_numpy(batch_indices) == -1)
    if bool(padded.any()):
        pos_ids = torch.as_tensor(to_numpy(pos_ids)).to(torch.int32).masked_fill(padded, 0)
    is_mla = len(k_rope.shape) == 2
    if is_mla and v is not None:
        raise InvalidArgumentError("v: must be None for MLA (2-D k_rope: ckv is the value)")
    if not is_mla and v is None:
        raise InvalidArgumentError("v: required for GQA/MHA (3-D k_rope)")
    q_r, k_r, q_n, k_n = rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache,
                                           pos_ids, is_neox, dtype, quant_scale_q, 1.0,
                                           q_rope_out, None, q_nope_out, None)
    # K in float32, scaled by quant_scale_kv: the append's own rounding (k_scale 1) is the
    # quantization, once.
    k3 = k_rope.unsqueeze(1) if is_mla else k_rope
    _, k32 = _rotated_f32(q_rope, k3, cos_sin_cache, pos_ids, is_neox)
    k32 = k32 * float(quant_scale_kv)
    indptr = to_numpy(kv_indptr).astype(np.int64)
    last = np.where(indptr[1:] > indptr[:-1], int(page_size), 0).astype(np.int32)
    last = numpy_like(kv_indptr, last)
    if is_mla:
        ckv = (k_nope.float() * float(quant_scale_kv)) if k_nope is not None else \
            k_rope.new_empty((k_rope.shape[0], 0), dtype=torch.float32)
        append_paged_mla_kv_cache(ckv, k32.squeeze(1), batch_indices, positions, cache_0,
                                  cache_1, kv_indices, kv_indptr, last)
    else:
        k_full = k32 if k_nope is None else torch.cat(
            [k32, k_nope.float() * float(quant_scale_kv)], dim=-1)
        append_paged_kv_cache(k_full, v.float() * float(quant_scale_kv), batch_indices,
                              positions, (cache_0, cache_1), kv_indices, kv_indptr, last,
                              kv_layout)
    return q_r, q_n

"""Rotary position embedding on q and k outside attention (flashinfer.rope): positions from a
ragged indptr + offsets or given per token, Llama 3.1 frequency scaling, a precomputed cos/sin
cache. The rotation itself is kvattn's C++ apply_rope."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _kvattn
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

"""The paged KV cache: appending K/V (quantizing to FP8 when the cache is FP8) and the index
helpers. FlashInfer's names and conventions (flashinfer.page)."""

from __future__ import annotations

from typing import Any, Tuple, Union

import numpy as np

from . import _kvattn
from ._attention import check_kv_layout, scale_caches
from ._errors import InvalidArgumentError
from ._tensors import (current_stream, device_of, numpy_like, split_paged_kv_cache,
                       tensor_dtype_name, to_numpy)


def get_seq_lens(kv_indptr: Any, kv_last_page_len: Any, page_size: int) -> Any:
    """KV length of each request of a page table: (pages - 1) * page_size + last_page_len, 0
    for a request without pages."""
    indptr = to_numpy(kv_indptr).astype(np.int64)
    last = to_numpy(kv_last_page_len).astype(np.int64)
    pages = indptr[1:] - indptr[:-1]
    lens = np.where(pages > 0, (pages - 1) * page_size + last, 0).astype(np.int32)
    return numpy_like(kv_indptr, lens)


def get_batch_indices_positions(append_indptr: Any, seq_lens: Any, nnz: int,
                                batch_indices: Any = None, positions: Any = None
                                ) -> Tuple[Any, Any]:
    """For appending nnz tokens (append_indptr [B+1]) to requests whose lengths after the
    append are seq_lens [B]: each token's request and position (int32 [nnz] each). Entries past
    append_indptr[-1] are padding (engines size these for the largest step): their batch index
    is -1, which append_paged_kv_cache skips, and their position 0 (FlashInfer's convention)."""
    indptr = to_numpy(append_indptr).astype(np.int64)
    lens = to_numpy(seq_lens).astype(np.int64)
    if indptr.ndim != 1 or len(indptr) != len(lens) + 1:
        raise InvalidArgumentError(
            f"append_indptr: {len(indptr)} entries, seq_lens: {len(lens)}: expected B+1 and B")
    counts = indptr[1:] - indptr[:-1]
    if np.any(counts < 0) or np.any(counts > lens):
        raise InvalidArgumentError(
            "append_indptr must be non-decreasing and append at most seq_lens[b] tokens")
    b = np.repeat(np.arange(len(lens), dtype=np.int64), counts)
    within = np.arange(int(indptr[-1]), dtype=np.int64) - indptr[:-1][b] if len(b) else b
    pos = lens[b] - counts[b] + within
    out_b = np.full(nnz, -1, dtype=np.int32)
    out_p = np.zeros(nnz, dtype=np.int32)
    out_b[:len(b)] = b[:nnz]
    out_p[:len(pos)] = pos[:nnz]
    if batch_indices is not None and positions is not None:
        batch_indices[...] = numpy_like(append_indptr, out_b)
        positions[...] = numpy_like(append_indptr, out_p)
        return batch_indices, positions
    return numpy_like(append_indptr, out_b), numpy_like(append_indptr, out_p)


def append_paged_kv_cache(append_key: Any, append_value: Any, batch_indices: Any,
                          positions: Any, paged_kv_cache: Union[Any, Tuple[Any, Any]],
                          kv_indices: Any, kv_indptr: Any, kv_last_page_len: Any,
                          kv_layout: str = "NHD", *, k_scale: float = 1.0,
                          v_scale: float = 1.0, kv_cache_sf: Any = None) -> None:
    """Writes append_key/value [nnz, H_kv, D] into the paged cache at (batch_indices[i],
    positions[i]), converting to the cache's dtype. A row whose batch index is -1 is padding
    (as get_batch_indices_positions produces) and writes nothing. An FP8 cache is quantized (round to
    nearest even, saturating): stored = value / scale. kvattn adds, as keywords: k_scale /
    v_scale (default 1, FlashInfer's plain cast), and kv_cache_sf=(k_scales, v_scales) — float32
    [P, page_size, H_kv] (HND: [P, H_kv, page_size], as FlashInfer's use_token_head_sf) — to
    quantize per (token, head): each row's scale amax/fp8_max is stored there and the row
    divided by it."""
    check_kv_layout(kv_layout)
    k_cache, v_cache = split_paged_kv_cache(paged_kv_cache, kv_layout)
    cache_dtype = tensor_dtype_name(k_cache) or ""
    granularity, k_sf, v_sf = "per_tensor", None, None
    if kv_cache_sf is not None:
        sf = scale_caches(kv_cache_sf, kv_layout)
        granularity, k_sf, v_sf = "per_token_head", sf["k_scale_cache"], sf["v_scale_cache"]
    _kvattn.append_paged_kv_cache(append_key, append_value, batch_indices, positions, k_cache,
                                  v_cache, kv_indices, kv_indptr, kv_last_page_len, kv_layout,
                                  cache_dtype, float(k_scale), float(v_scale), granularity,
                                  k_sf, v_sf, "auto", device_of(k_cache), 0,
                                  current_stream(device_of(k_cache)))


def append_paged_mla_kv_cache(append_ckv: Any, append_kpe: Any, batch_indices: Any,
                              positions: Any, ckv_cache: Any, kpe_cache: Any, kv_indices: Any,
                              kv_indptr: Any, kv_last_page_len: Any, *,
                              k_scale: float = 1.0) -> None:
    """Writes append_ckv [nnz, D_ckv] and append_kpe [nnz, D_kpe] into the paged latent caches
    ckv_cache [P, page_size, D_ckv], kpe_cache [P, page_size, D_kpe] at (batch_indices[i],
    positions[i]); an FP8 cache is quantized with k_scale (kvattn's keyword, default 1). Rows
    whose batch index is -1 are padding and write nothing."""
    _kvattn.append_paged_mla_kv_cache(append_ckv, append_kpe, batch_indices, positions,
                                      ckv_cache, kpe_cache, kv_indices, kv_indptr,
                                      kv_last_page_len, tensor_dtype_name(ckv_cache) or "",
                                      float(k_scale), "auto", device_of(ckv_cache), 0,
                                      current_stream(device_of(ckv_cache)))

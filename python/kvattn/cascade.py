"""Merging attention states (cascade / shared-prefix / split-KV) and the multi-level cascade
wrapper. FlashInfer's names and conventions (flashinfer.cascade): the LSE is base 2 here; the
C++ API takes the natural log, so states are converted on the way in and out."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from . import _kvattn
from ._attention import check_kv_layout
from ._errors import InvalidArgumentError
from ._tensors import (LN2, LOG2E, current_stream, device_of, empty, empty_f32, is_torch,
                       scale_inplace, scaled_copy)
from .prefill import BatchPrefillWithPagedKVCacheWrapper


def _value_dtype(v: Any) -> str:
    """The output's dtype: v's; f32 where v has no value dtype (C++ then refuses v's)."""
    from ._tensors import tensor_dtype_name
    return tensor_dtype_name(v) or "f32"


def merge_state(v_a: Any, s_a: Any, v_b: Any, s_b: Any) -> Tuple[Any, Any]:
    """The attention state over the union of two key sets: v_* [N, H, D], s_* [N, H] float32
    (base-2 LSE). Returns (v_merged, s_merged). A state with s = -inf is the identity."""
    v_out = empty(v_a, v_a.shape, _value_dtype(v_a))
    s_out = empty_f32(v_a, s_a.shape)
    _kvattn.merge_state(v_a, scaled_copy(s_a, LN2), v_b, scaled_copy(s_b, LN2), v_out, s_out,
                        "auto", device_of(v_a), 0,
                        current_stream(device_of(v_a)))
    scale_inplace(s_out, LOG2E)
    return v_out, s_out


def merge_state_in_place(v: Any, s: Any, v_other: Any, s_other: Any,
                         mask: Optional[Any] = None) -> None:
    """v, s ⊕= v_other, s_other (base-2 LSE), in place; rows where `mask` [N] is False are left
    as they are."""
    if mask is not None:
        rows = mask.nonzero().reshape(-1) if is_torch(mask) else mask.nonzero()[0]
        if len(rows) == 0:
            return
        v_rows, s_rows = v[rows], s[rows]
        merge_state_in_place(v_rows, s_rows, v_other[rows], s_other[rows])
        v[rows] = v_rows
        s[rows] = s_rows
        return
    # kvattn's merge writes outputs that overlap no input: merge from a copy of (v, s).
    v_in = v.clone() if is_torch(v) else v.copy()
    s_out = empty_f32(v, s.shape)
    _kvattn.merge_state(v_in, scaled_copy(s, LN2), v_other, scaled_copy(s_other, LN2), v, s_out,
                        "auto", device_of(v), 0,
                        current_stream(device_of(v)))
    scale_inplace(s_out, LOG2E)
    s[...] = s_out


def merge_states(v: Any, s: Any) -> Tuple[Any, Any]:
    """Merges S states per row: v [N, S, H, D], s [N, S, H] (base-2 LSE) -> (v [N, H, D],
    s [N, H])."""
    # C++ refuses a v that is not [N, S, H, D] (the output's shape is then a placeholder)
    n, h, d = (v.shape[0], v.shape[2], v.shape[3]) if len(v.shape) == 4 else (1, 1, 1)
    v_out = empty(v, (n, h, d), _value_dtype(v))
    s_out = empty_f32(v, (n, h))
    _kvattn.merge_states(v, scaled_copy(s, LN2), v_out, s_out, "auto", device_of(v), 0,
                         current_stream(device_of(v)))
    scale_inplace(s_out, LOG2E)
    return v_out, s_out


class MultiLevelCascadeAttentionWrapper:
    """Cascade attention over `num_levels` levels of paged KV (level 0: the prefix shared by
    the most requests, ..., the last level: each request's own pages): each level runs as a
    batch prefill with its own qo_indptr and page table, and the states merge level by level.
    Causality applies to the last level only, as in FlashInfer."""

    def __init__(self, num_levels: int, float_workspace_buffer: Any, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, qo_indptr_buf_arr: Optional[List[Any]] = None,
                 paged_kv_indptr_buf_arr: Optional[List[Any]] = None,
                 paged_kv_indices_buf_arr: Optional[List[Any]] = None,
                 paged_kv_last_page_len_buf_arr: Optional[List[Any]] = None) -> None:
        if num_levels < 1:
            raise InvalidArgumentError(f"num_levels = {num_levels}: must be >= 1")
        check_kv_layout(kv_layout)
        self._kv_layout = kv_layout
        self._num_levels = num_levels
        self._batch_prefill_wrappers = [
            BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)
            for _ in range(num_levels)]

    def reset_workspace_buffer(self, float_workspace_buffer: Any,
                               int_workspace_buffers: List[Any]) -> None:
        for w in self._batch_prefill_wrappers:
            w.reset_workspace_buffer(float_workspace_buffer, None)

    def plan(self, qo_indptr_arr: List[Any], paged_kv_indptr_arr: List[Any],
             paged_kv_indices_arr: List[Any], paged_kv_last_page_len: List[Any],
             num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
             causal: bool = False, pos_encoding_mode: str = "NONE",
             use_fp16_qk_reduction: bool = False, sm_scale: Optional[float] = None,
             window_left: int = -1, logits_soft_cap: Optional[float] = None,
             rope_scale: Optional[float] = None, rope_theta: Optional[float] = None,
             q_data_type: Any = "float16", kv_data_type: Any = None) -> None:
        """Plans every level: per level a qo_indptr, a page table (indptr, indices) and
        last_page_len, all int32."""
        for name, arr in (("qo_indptr_arr", qo_indptr_arr),
                          ("paged_kv_indptr_arr", paged_kv_indptr_arr),
                          ("paged_kv_indices_arr", paged_kv_indices_arr),
                          ("paged_kv_last_page_len", paged_kv_last_page_len)):
            if len(arr) != self._num_levels:
                raise InvalidArgumentError(
                    f"{name}: {len(arr)} levels, the wrapper has {self._num_levels}")
        for level, wrapper in enumerate(self._batch_prefill_wrappers):
            wrapper.plan(qo_indptr_arr[level], paged_kv_indptr_arr[level],
                         paged_kv_indices_arr[level], paged_kv_last_page_len[level],
                         num_qo_heads, num_kv_heads, head_dim, page_size,
                         causal=causal if level == self._num_levels - 1 else False,
                         pos_encoding_mode=pos_encoding_mode,
                         use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale,
                         window_left=window_left, logits_soft_cap=logits_soft_cap,
                         rope_scale=rope_scale, rope_theta=rope_theta, q_data_type=q_data_type,
                         kv_data_type=kv_data_type)

    begin_forward = plan

    def run(self, q: Any, paged_kv_cache: Any) -> Any:
        """Cascade attention of q [N, H_qo, D] over every level; returns out [N, H_qo, D]."""
        out, lse = self._batch_prefill_wrappers[0].run(q, paged_kv_cache, return_lse=True)
        for wrapper in self._batch_prefill_wrappers[1:]:
            out_i, lse_i = wrapper.run(q, paged_kv_cache, return_lse=True)
            merge_state_in_place(out, lse, out_i, lse_i)
        return out

    forward = run


class BatchDecodeWithSharedPrefixPagedKVCacheWrapper:
    """FlashInfer's legacy shared-prefix decode (superseded by MultiLevelCascadeAttentionWrapper):
    every request's query attends to one shared prefix k_shared/v_shared (NHD [L, H_kv, D] or
    HND [H_kv, L, D]) and to its own pages; the two states merge."""

    def __init__(self, float_workspace_buffer: Any, kv_layout: str = "NHD") -> None:
        from .decode import BatchDecodeWithPagedKVCacheWrapper
        self._kv_layout = check_kv_layout(kv_layout)
        self._batch_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer,
                                                                        kv_layout)

    def reset_workspace_buffer(self, float_workspace_buffer: Any,
                               int_workspace_buffer: Any) -> None:
        self._batch_decode_wrapper.reset_workspace_buffer(float_workspace_buffer,
                                                          int_workspace_buffer)

    def begin_forward(self, unique_kv_indptr: Any, unique_kv_indices: Any,
                      unique_kv_last_page_len: Any, num_qo_heads: int, num_kv_heads: int,
                      head_dim: int, page_size: int, data_type: Any = "float16") -> None:
        """Plans the unique part (each request's pages); data_type is q's and the cache's."""
        self._batch_decode_wrapper.begin_forward(
            unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len, num_qo_heads,
            num_kv_heads, head_dim, page_size, q_data_type=data_type, kv_data_type=data_type)

    plan = begin_forward

    def forward(self, q: Any, k_shared: Any, v_shared: Any, unique_kv_cache: Any) -> Any:
        """out [B, H_qo, D]: q [B, H_qo, D] over the shared prefix and each request's pages."""
        from .prefill import single_prefill_with_kv_cache
        v_shared_out, s_shared = single_prefill_with_kv_cache(
            q, k_shared, v_shared, causal=False, pos_encoding_mode="NONE",
            kv_layout=self._kv_layout, return_lse=True)
        v_unique, s_unique = self._batch_decode_wrapper.forward_return_lse(q, unique_kv_cache)
        merge_state_in_place(v_shared_out, s_shared, v_unique, s_unique)
        return v_shared_out

    run = forward

    def end_forward(self) -> None:
        """Deprecated no-op (FlashInfer)."""


class BatchPrefillWithSharedPrefixPagedKVCacheWrapper:
    """FlashInfer's legacy shared-prefix prefill: ragged queries (qo_indptr) attend to one
    shared prefix (non-causal) and to their own pages (causal if asked); the states merge."""

    def __init__(self, float_workspace_buffer: Any, kv_layout: str = "NHD") -> None:
        self._kv_layout = check_kv_layout(kv_layout)
        self._batch_prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(
            float_workspace_buffer, kv_layout)

    def reset_workspace_buffer(self, float_workspace_buffer: Any,
                               int_workspace_buffer: Any) -> None:
        self._batch_prefill_wrapper.reset_workspace_buffer(float_workspace_buffer,
                                                           int_workspace_buffer)

    def begin_forward(self, qo_indptr: Any, paged_kv_indptr: Any, paged_kv_indices: Any,
                      paged_kv_last_page_len: Any, num_qo_heads: int, num_kv_heads: int,
                      head_dim: int, page_size: int) -> None:
        """Plans the unique part: ragged queries over each request's pages."""
        self._batch_prefill_wrapper.begin_forward(
            qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
            num_kv_heads, head_dim, page_size)

    plan = begin_forward

    def forward(self, q: Any, k_shared: Any, v_shared: Any, unique_kv_cache: Any,
                causal: bool = False, use_fp16_qk_reduction: bool = False,
                sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                rope_theta: Optional[float] = None) -> Any:
        """out [qo_indptr[-1], H_qo, D]; `causal` masks the unique part (bottom-right)."""
        from .prefill import single_prefill_with_kv_cache
        v_shared_out, s_shared = single_prefill_with_kv_cache(
            q, k_shared, v_shared, causal=False, pos_encoding_mode="NONE",
            kv_layout=self._kv_layout, use_fp16_qk_reduction=use_fp16_qk_reduction,
            sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta, return_lse=True)
        v_unique, s_unique = self._batch_prefill_wrapper.forward_return_lse(
            q, unique_kv_cache, causal=causal, pos_encoding_mode="NONE",
            use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale,
            rope_scale=rope_scale, rope_theta=rope_theta)
        merge_state_in_place(v_shared_out, s_shared, v_unique, s_unique)
        return v_shared_out

    run = forward

    def end_forward(self) -> None:
        """Deprecated no-op (FlashInfer)."""

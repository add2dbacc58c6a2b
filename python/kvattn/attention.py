"""FlashInfer's flashinfer.attention names: BatchAttention (one wrapper for prefill and decode,
planned from per-request KV lengths) and the attention-sink wrapper, built on kvattn's batch
prefill over a paged cache."""

from __future__ import annotations

import functools
from typing import Any, Optional, Tuple, Union

import numpy as np

from ._attention import check_kv_layout, unsupported
from ._errors import InvalidArgumentError
from ._tensors import host_i32
from .prefill import BatchPrefillWithPagedKVCacheWrapper


class _TorchDtype(str):
    """A dtype default spelled as FlashInfer's signature spells it (torch.bfloat16), without
    importing torch here: the string is the dtype's name, its repr the torch spelling."""

    def __repr__(self) -> str:
        return f"torch.{str(self)}"


_BF16 = _TorchDtype("bfloat16")


class BatchAttention:
    """Attention of ragged queries (qo_indptr) over a paged cache whose requests hold
    kv_len_arr[b] keys (FlashInfer's holistic kernel; here kvattn's batch prefill). run returns
    (out, lse), lse base 2 [nnz, H_qo]."""

    def __init__(self, kv_layout: str = "NHD", device: str = "cuda") -> None:
        self._kv_layout = check_kv_layout(kv_layout)
        self._device = str(device)
        self._wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
        self._logits_soft_cap = 0.0

    def plan(self, qo_indptr: Any, kv_indptr: Any, kv_indices: Any, kv_len_arr: Any,
             num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, head_dim_vo: int,
             page_size: int, causal: bool = False, sm_scale: Optional[float] = None,
             logits_soft_cap: Optional[float] = None, q_data_type: Any = _BF16,
             kv_data_type: Any = _BF16, use_profiler: bool = False) -> None:
        """Plans for qo_indptr [B+1], a page table kv_indptr [B+1] / kv_indices and the KV
        length of each request kv_len_arr [B] (the last page holds the rest)."""
        if use_profiler:
            raise unsupported("use_profiler", "kvattn has no kernel profiler")
        pages = host_i32(kv_indptr, "kv_indptr").astype(np.int64)
        lens = host_i32(kv_len_arr, "kv_len_arr").astype(np.int64)
        if len(lens) != len(pages) - 1:
            raise InvalidArgumentError(
                f"kv_len_arr: {len(lens)} entries: must be B = {len(pages) - 1} "
                "(kv_indptr has B + 1)")
        counts = pages[1:] - pages[:-1]
        # The page table's last_page_len from the lengths; the C++ page-table check decides
        # whether the lengths fit the pages (a length that does not yields last_page_len
        # outside [1, page_size]).
        last = np.where(counts > 0, lens - (counts - 1) * int(page_size), 0).astype(np.int32)
        bad = (counts == 0) & (lens > 0)
        if np.any(bad):
            b = int(np.argmax(bad))
            raise InvalidArgumentError(
                f"kv_len_arr[{b}] = {int(lens[b])}: request {b} has no pages in kv_indptr")
        import torch  # BatchAttention is FlashInfer's torch API
        workspace = torch.empty(1, dtype=torch.uint8, device=self._device)
        self._wrapper = BatchPrefillWithPagedKVCacheWrapper(workspace, self._kv_layout)
        self._wrapper.plan(qo_indptr, kv_indptr, kv_indices, last, num_qo_heads,
                           num_kv_heads, head_dim_qk, page_size, head_dim_vo=head_dim_vo,
                           causal=causal, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap,
                           q_data_type=q_data_type, kv_data_type=kv_data_type)
        self._logits_soft_cap = 0.0 if logits_soft_cap is None else float(logits_soft_cap)

    def run(self, q: Any, kv_cache: Union[Any, Tuple[Any, Any]], out: Any = None,
            lse: Any = None, k_scale: Optional[float] = None, v_scale: Optional[float] = None,
            logits_soft_cap: float = 0.0, profiler_buffer: Any = None,
            kv_cache_sf: Any = None) -> Tuple[Any, Any]:
        """(out [nnz, H_qo, D_vo], lse [nnz, H_qo] base 2)."""
        if self._wrapper is None:
            raise InvalidArgumentError("run before plan: call plan() first")
        if profiler_buffer is not None:
            raise unsupported("profiler_buffer", "kvattn has no kernel profiler")
        if logits_soft_cap and float(logits_soft_cap) != self._logits_soft_cap:
            raise InvalidArgumentError(
                f"logits_soft_cap = {logits_soft_cap}: differs from the planned "
                f"{self._logits_soft_cap} (FlashInfer requires it at plan)")
        return self._wrapper.run(q, kv_cache, k_scale=k_scale, v_scale=v_scale, out=out,
                                 lse=lse, return_lse=True, kv_cache_sf=kv_cache_sf)


def _run_with_sinks(wrapper: Any, base_run: Any, q: Any, paged_kv_cache: Any, args: Tuple,
                    q_scale: Optional[float], k_scale: Optional[float],
                    kwargs: dict) -> Any:
    """The attention-sink wrappers' run(q, paged_kv_cache, sinks, sm_scale, ...): FlashInfer's
    positional (sinks, sm_scale) onto the base wrapper's keywords."""
    if len(args) > 2:
        raise unsupported("args", f"{len(args)} extra positional arguments: the sink "
                          "wrapper takes (sinks, sm_scale)")
    sinks = args[0] if len(args) > 0 else kwargs.pop("sinks", None)
    sm_scale = args[1] if len(args) > 1 else kwargs.pop("sm_scale", None)
    if sinks is None:
        raise InvalidArgumentError("sinks: required (float32 [num_qo_heads])")
    if sm_scale is not None:
        wrapper._forward_params(sm_scale=float(sm_scale))
    return base_run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, sinks=sinks, **kwargs)


class BatchAttentionWithAttentionSinkWrapper(BatchPrefillWithPagedKVCacheWrapper):
    """Batch prefill / decode over a paged cache with a learned sink logit per head (as
    gpt-oss): run(q, paged_kv_cache, sinks, sm_scale). FlashInfer's constructor arguments that
    describe its JIT module (dtypes, head dims, window, position encoding) are taken as
    declared; plan fixes the problem, and run's sm_scale replaces the planned one."""

    def __init__(self, float_workspace_buffer: Any, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, qo_indptr_buf: Any = None,
                 paged_kv_indptr_buf: Any = None, paged_kv_indices_buf: Any = None,
                 paged_kv_last_page_len_buf: Any = None, custom_mask_buf: Any = None,
                 mask_indptr_buf: Any = None, backend: str = "auto",
                 pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
                 q_data_type: Any = _BF16, kv_data_type: Any = _BF16,
                 head_dim_qk: int = 128, head_dim_vo: int = 128,
                 window_left: int = -1) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, qo_indptr_buf,
                         paged_kv_indptr_buf, paged_kv_indices_buf, paged_kv_last_page_len_buf,
                         custom_mask_buf, mask_indptr_buf, backend)

    def run(self, q: Any, paged_kv_cache: Union[Any, Tuple[Any, Any]], *args: Any,
            q_scale: Optional[float] = None, k_scale: Optional[float] = None,
            **kwargs: Any) -> Any:
        """run(q, paged_kv_cache, sinks, sm_scale, ...): sinks float32 [H_qo]."""
        return _run_with_sinks(self, super().run, q, paged_kv_cache, args, q_scale, k_scale,
                               kwargs)

    run_return_lse = functools.partialmethod(run, return_lse=True)


from .decode import BatchDecodeWithPagedKVCacheWrapper  # noqa: E402


class BatchDecodeWithAttentionSinkWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """Decode with a learned sink logit per head: run(q, paged_kv_cache, sinks, sm_scale).
    The constructor's JIT-module arguments (dtypes, head dims, window) are taken as declared;
    plan fixes the problem (a position encoding the backend cannot fuse with sinks is C++'s
    refusal)."""

    def __init__(self, float_workspace_buffer: Any, kv_layout: str = "NHD",
                 backend: str = "auto", q_data_type: Any = _BF16,
                 kv_data_type: Any = _BF16, head_dim_qk: int = 128,
                 head_dim_vo: int = 128, window_left: int = -1, **kwargs: Any) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_tensor_cores=True,
                         backend=backend, **kwargs)

    def run(self, q: Any, paged_kv_cache: Union[Any, Tuple[Any, Any]], *args: Any,
            q_scale: Optional[float] = None, k_scale: Optional[float] = None,
            **kwargs: Any) -> Any:
        """run(q, paged_kv_cache, sinks, sm_scale, ...): sinks float32 [H_qo]."""
        return _run_with_sinks(self, super().run, q, paged_kv_cache, args, q_scale, k_scale,
                               kwargs)

    run_return_lse = functools.partialmethod(run, return_lse=True)

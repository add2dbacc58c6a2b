"""FlashInfer's POD wrappers (flashinfer.pod): a prefill batch and a decode batch in one call
(FlashInfer runs them in one kernel, sharing the SMs; kvattn runs them one after the other, so
the results are the same and the call is the same)."""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

from ._attention import check_kv_layout, unsupported
from ._errors import InvalidArgumentError
from .decode import BatchDecodeWithPagedKVCacheWrapper
from .prefill import BatchPrefillWithPagedKVCacheWrapper, single_prefill_with_kv_cache


def _same_layout(given: str, planned: str, argument: str) -> None:
    if given != planned:
        raise InvalidArgumentError(f"{argument} = {given!r}: must be the wrapper's kv_layout "
                                   f"{planned!r}")


class PODWithPagedKVCacheWrapper:
    """One request's prefill (q_p over its own k_p, v_p) and a decode batch over the paged
    cache (planned like BatchDecodeWithPagedKVCacheWrapper), in one run. Returns
    (out_p, out_d), as FlashInfer's (which does not return the LSE either)."""

    def __init__(self, float_workspace_buffer: Any, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, paged_kv_indptr_buffer: Any = None,
                 paged_kv_indices_buffer: Any = None,
                 paged_kv_last_page_len_buffer: Any = None, jit_args: Any = None) -> None:
        if jit_args is not None:
            raise unsupported("jit_args", "kvattn has no JIT-compiled custom variants")
        self._kv_layout = check_kv_layout(kv_layout)
        self._decode = BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout,
                                                          use_cuda_graph)

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._decode.is_cuda_graph_enabled

    def reset_workspace_buffer(self, float_workspace_buffer: Any,
                               int_workspace_buffer: Any) -> None:
        self._decode.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

    def plan(self, indptr: Any, indices: Any, last_page_len: Any, num_qo_heads: int,
             num_kv_heads: int, head_dim: int, page_size: int, pos_encoding_mode: str = "NONE",
             window_left: int = -1, q_data_type: Any = "float16", kv_data_type: Any = None,
             data_type: Any = None, sm_scale: Optional[float] = None,
             rope_scale: Optional[float] = None, rope_theta: Optional[float] = None,
             non_blocking: bool = True) -> None:
        """Plans the decode part (the prefill part needs no plan)."""
        self._decode.plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                          page_size, pos_encoding_mode=pos_encoding_mode,
                          window_left=window_left, q_data_type=q_data_type,
                          kv_data_type=kv_data_type, data_type=data_type, sm_scale=sm_scale,
                          rope_scale=rope_scale, rope_theta=rope_theta,
                          non_blocking=non_blocking)

    begin_forward = plan

    def run(self, q_p: Any, k_p: Any, v_p: Any, q_d: Any,
            paged_kv_cache_d: Union[Any, Tuple[Any, Any]], custom_mask_p: Any = None,
            packed_custom_mask_p: Any = None, causal_p: bool = False, kv_layout_p: str = "NHD",
            pos_encoding_mode_p: str = "NONE", sm_scale_p: Optional[float] = None,
            window_left_p: int = -1, rope_scale_p: Optional[float] = None,
            rope_theta_p: Optional[float] = None, return_lse_p: bool = False,
            custom_mask_d: Any = None, packed_custom_mask_d: Any = None,
            causal_d: bool = False, kv_layout_d: str = "NHD",
            pos_encoding_mode_d: str = "NONE", sm_scale_d: Optional[float] = None,
            window_left_d: int = -1, rope_scale_d: Optional[float] = None,
            rope_theta_d: Optional[float] = None, q_scale: Optional[float] = None,
            k_scale: Optional[float] = None, v_scale: Optional[float] = None,
            return_lse_d: bool = False, use_fp16_qk_reduction: bool = False,
            enable_pdl: Optional[bool] = None, *args: Any) -> Tuple[Any, Any]:
        """(out_p [qo_len, H_qo, D], out_d [B, H_qo, D]). The _d parameters replace the
        planned decode ones (as FlashInfer's run does); q/k/v_scale apply to both parts."""
        if args:
            raise unsupported("args", "kvattn has no custom-kernel arguments")
        if custom_mask_d is not None or packed_custom_mask_d is not None:
            raise unsupported("custom_mask_d", "the decode part takes no custom mask")
        _same_layout(kv_layout_d, self._kv_layout, "kv_layout_d")
        out_p = single_prefill_with_kv_cache(
            q_p, k_p, v_p, custom_mask=custom_mask_p, packed_custom_mask=packed_custom_mask_p,
            causal=causal_p, kv_layout=kv_layout_p, pos_encoding_mode=pos_encoding_mode_p,
            use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale_p,
            window_left=window_left_p, rope_scale=rope_scale_p, rope_theta=rope_theta_p,
            k_scale=k_scale, v_scale=v_scale)
        self._decode._forward_params(pos_encoding_mode=pos_encoding_mode_d,
                                     window_left=window_left_d, sm_scale=sm_scale_d,
                                     rope_scale=rope_scale_d, rope_theta=rope_theta_d)
        out_d = self._decode.run(q_d, paged_kv_cache_d, q_scale=q_scale, k_scale=k_scale,
                                 v_scale=v_scale)
        return out_p, out_d

    def end_forward(self) -> None:
        """Deprecated no-op (FlashInfer)."""


class BatchPODWithPagedKVCacheWrapper:
    """A prefill batch (qo_indptr_p over its page table) and a decode batch (qo_indptr_d over
    its page table) over paged caches, in one run. Returns (out_p, out_d), or
    ((out_p, lse_p), (out_d, lse_d)) with return_lse (base 2)."""

    def __init__(self, float_workspace_buffer: Any, kv_layout: str = "NHD") -> None:
        self._kv_layout = check_kv_layout(kv_layout)
        self._prefill = BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)
        self._decode = BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)
        self._planned = False

    def reset_workspace_buffer(self, float_workspace_buffer: Any,
                               int_workspace_buffer: Any) -> None:
        self._prefill.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)
        self._decode.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

    def plan(self, qo_indptr_p: Any, kv_indptr_p: Any, kv_indices_p: Any,
             last_page_len_p: Any, qo_indptr_d: Any, kv_indptr_d: Any, kv_indices_d: Any,
             last_page_len_d: Any, num_qo_heads: int, num_kv_heads: int, head_dim: int,
             page_size: int, pos_encoding_mode: str = "NONE", window_left: int = -1,
             q_data_type: Any = "float16", kv_data_type: Any = None, data_type: Any = None,
             sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, non_blocking: bool = True) -> None:
        """Plans both batches (the prefill's causality comes with run's causal_p)."""
        if data_type is not None:
            q_data_type = data_type if q_data_type is None else q_data_type
            kv_data_type = data_type if kv_data_type is None else kv_data_type
        common = dict(pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                      q_data_type=q_data_type, kv_data_type=kv_data_type, sm_scale=sm_scale,
                      rope_scale=rope_scale, rope_theta=rope_theta)
        self._prefill.plan(qo_indptr_p, kv_indptr_p, kv_indices_p, last_page_len_p,
                           num_qo_heads, num_kv_heads, head_dim, page_size, **common)
        self._decode.plan(qo_indptr_d, kv_indptr_d, kv_indices_d, last_page_len_d,
                          num_qo_heads, num_kv_heads, head_dim, page_size, **common)
        self._planned = True

    begin_forward = plan

    def run(self, q_p: Any, paged_kv_cache_p: Union[Any, Tuple[Any, Any]], q_d: Any,
            paged_kv_cache_d: Union[Any, Tuple[Any, Any]], custom_mask_p: Any = None,
            packed_custom_mask_p: Any = None, causal_p: bool = False,
            q_scale: Optional[float] = None, k_scale: Optional[float] = None,
            v_scale: Optional[float] = None, return_lse: bool = False,
            use_fp16_qk_reduction: bool = False, enable_pdl: Optional[bool] = None) -> Any:
        if not self._planned:
            raise InvalidArgumentError("run before plan: call plan() first")
        if custom_mask_p is not None or packed_custom_mask_p is not None:
            # A mask is part of kvattn's plan: plan the prefill part again with it.
            args = self._prefill._plan_args
            self._prefill._make_plan(**dict(args, custom_mask=custom_mask_p,
                                            packed_custom_mask=packed_custom_mask_p,
                                            causal=causal_p,
                                            use_fp16_qk_reduction=use_fp16_qk_reduction))
        else:
            self._prefill._forward_params(causal=causal_p,
                                          use_fp16_qk_reduction=use_fp16_qk_reduction)
        self._decode._forward_params(use_fp16_qk_reduction=use_fp16_qk_reduction)
        scales = dict(q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)
        p = self._prefill.run(q_p, paged_kv_cache_p, return_lse=return_lse, **scales)
        d = self._decode.run(q_d, paged_kv_cache_d, return_lse=return_lse, **scales)
        return p, d

"""Prefill / extend attention: ragged queries over a paged or a ragged KV cache, and the
single-request form. FlashInfer's names, parameters and defaults (flashinfer.prefill)."""

from __future__ import annotations

import functools
from typing import Any, Dict, Optional, Tuple, Union

from ._attention import (AttentionPlan, check_backend, check_kv_layout, check_pos_encoding_mode,
                         kv_scales, problem_fields, resolve_dtypes, run_once, scale_caches,
                         scale_value, soft_cap, unsupported)
from ._errors import InvalidArgumentError
from ._tensors import cache_tensors, device_of, host_i32, numpy_like, tensor_dtype_name

_NO_SPLIT = 1 << 62


def _mask_fields(custom_mask: Any, packed_custom_mask: Any, causal: bool
                 ) -> Tuple[Dict[str, Any], bool, bool]:
    """The mask tensor the plan keeps (flattened view, as given: bool/uint8 one byte per
    element, or FlashInfer's packed little-endian bits), whether it is packed, and causal."""
    if packed_custom_mask is not None:
        return {"custom_mask": packed_custom_mask.reshape(-1)}, True, False
    if custom_mask is not None:
        return {"custom_mask": custom_mask.reshape(-1)}, False, False
    return {}, False, bool(causal)


def _split(fixed_split_size: Optional[int], disable_split_kv: bool, page_size: int = 1) -> int:
    if disable_split_kv:
        return _NO_SPLIT
    if fixed_split_size is not None and fixed_split_size > 0:
        return int(fixed_split_size) * int(page_size)
    return 0


def _refuse(**given: Any) -> None:
    for name, value in given.items():
        if value is not None:
            raise unsupported(name, "not supported by kvattn (FlashInfer's multi-item scoring and "
                              "trtllm-gen arguments)")


def _refuse_run(args: Tuple[Any, ...], skip_softmax_threshold_scale_factor: Any = None) -> None:
    if args:
        raise unsupported("args", "kvattn has no custom-kernel arguments")
    if skip_softmax_threshold_scale_factor is not None:
        raise unsupported("skip_softmax_threshold_scale_factor", "kvattn computes exact softmax")


class _PrefillWrapper:
    """What the paged and ragged wrappers share: workspace, backend, the plan, run."""

    def __init__(self, float_workspace_buffer: Any, kv_layout: str, use_cuda_graph: bool,
                 backend: str, jit_args: Any, jit_kwargs: Any) -> None:
        if jit_args is not None or jit_kwargs is not None:
            raise unsupported("jit_args", "kvattn has no JIT-compiled custom variants")
        self._kv_layout = check_kv_layout(kv_layout)
        self._backend = check_backend(backend)
        self._workspace = float_workspace_buffer
        self._device = device_of(float_workspace_buffer)
        self._use_cuda_graph = use_cuda_graph
        self._plan: Optional[AttentionPlan] = None
        self._window_left = -1
        self._use_token_head_sf = False

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    @property
    def backend(self) -> Optional[str]:
        """The backend the last plan chose."""
        return None if self._plan is None else self._plan.backend

    def reset_workspace_buffer(self, float_workspace_buffer: Any,
                               int_workspace_buffer: Any) -> None:
        self._workspace = float_workspace_buffer

    def end_forward(self) -> None:
        """Deprecated no-op (FlashInfer)."""

    def _make_plan(self, op: str, index: Dict[str, Any], nnz_qo: int, num_qo_heads: int,
                   num_kv_heads: int, head_dim_qk: int, head_dim_vo: Optional[int],
                   page_size: Optional[int], custom_mask: Any, packed_custom_mask: Any,
                   causal: bool, pos_encoding_mode: str, use_fp16_qk_reduction: bool,
                   sm_scale: Optional[float], window_left: int, logits_soft_cap: Optional[float],
                   rope_scale: Optional[float], rope_theta: Optional[float], q_data_type: Any,
                   kv_data_type: Any, o_data_type: Any, chunk: int, num_threads: int,
                   use_token_head_sf: bool = False) -> None:
        # What this plan was made from: the deprecated forward() may change the problem
        # parameters (FlashInfer's forward sets them on the wrapper for run), and replans.
        self._plan_args = {k: v for k, v in locals().items() if k != "self"}
        mask, packed, causal = _mask_fields(custom_mask, packed_custom_mask, causal)
        q, kv, o = resolve_dtypes(q_data_type, kv_data_type, o_data_type)
        fields = problem_fields(
            batch_size=max(len(index["qo_indptr"]) - 1, 0), num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk,
            head_dim_vo=head_dim_qk if head_dim_vo is None else head_dim_vo,
            page_size=page_size, kv_layout=self._kv_layout, causal=causal,
            custom_mask=bool(mask), pos_encoding_mode=check_pos_encoding_mode(pos_encoding_mode),
            use_fp16_qk_reduction=bool(use_fp16_qk_reduction),
            sm_scale=None if sm_scale is None else float(sm_scale), window_left=window_left,
            logits_soft_cap=soft_cap(logits_soft_cap),
            rope_scale=1.0 if rope_scale is None else float(rope_scale),
            rope_theta=1e4 if rope_theta is None else float(rope_theta), q_data_type=q,
            kv_data_type=kv, o_data_type=o,
            kv_scale_granularity="per_token_head" if use_token_head_sf else None)
        self._use_token_head_sf = bool(use_token_head_sf)
        self._plan = AttentionPlan(op, fields, dict(index, **mask), self._backend, self._device,
                                   nnz_qo, num_threads=num_threads, kv_chunk_size=chunk,
                                   custom_mask_packed=packed)
        self._window_left = window_left

    def _scale_tensors(self, kv_cache_sf: Any) -> Dict[str, Any]:
        if self._use_token_head_sf:
            if kv_cache_sf is None:
                raise InvalidArgumentError("kv_cache_sf: required, the plan has "
                                           "use_token_head_sf=True")
            return scale_caches(kv_cache_sf, self._kv_layout)
        if kv_cache_sf is not None:
            raise unsupported("kv_cache_sf", "given without use_token_head_sf=True at plan "
                              "(NVFP4 block scales are not kvattn's)")
        return {}

    def _forward_params(self, **params: Any) -> None:
        """FlashInfer's deprecated forward()/forward_return_lse() set causal, pos_encoding_mode,
        use_fp16_qk_reduction, window_left, logits_soft_cap, sm_scale, rope_scale and
        rope_theta on the wrapper, and run uses them: where they differ from the plan's, the
        same page table is planned again with them (once; later calls find them planned)."""
        if self._plan is None:
            raise InvalidArgumentError("run before plan: call plan() first")
        args = self._plan_args
        if all(args[k] == v for k, v in params.items()):
            return
        self._make_plan(**dict(args, **params))

    def _planned(self, window_left: Optional[int]) -> AttentionPlan:
        if self._plan is None:
            raise InvalidArgumentError("run before plan: call plan() first")
        if window_left is not None and window_left != self._window_left:
            raise InvalidArgumentError(
                f"window_left = {window_left}: differs from the planned {self._window_left} "
                "(plan again for another window)")
        return self._plan


class BatchPrefillWithPagedKVCacheWrapper(_PrefillWrapper):
    """Batch prefill / extend: ragged queries (qo_indptr) over a paged KV cache. `plan` once per
    step, `run` per layer. kvattn differences as for the decode wrapper."""

    def __init__(self, float_workspace_buffer: Any, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, qo_indptr_buf: Any = None,
                 paged_kv_indptr_buf: Any = None, paged_kv_indices_buf: Any = None,
                 paged_kv_last_page_len_buf: Any = None, custom_mask_buf: Any = None,
                 mask_indptr_buf: Any = None, backend: str = "auto", jit_args: Any = None,
                 jit_kwargs: Any = None, variant_owns_mask: bool = False,
                 max_total_num_rows: Optional[int] = None) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args,
                         jit_kwargs)

    def plan(self, qo_indptr: Any, paged_kv_indptr: Any, paged_kv_indices: Any,
             paged_kv_last_page_len: Any, num_qo_heads: int, num_kv_heads: int,
             head_dim_qk: int, page_size: int, head_dim_vo: Optional[int] = None,
             custom_mask: Any = None, packed_custom_mask: Any = None, causal: bool = False,
             pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
             sm_scale: Optional[float] = None, window_left: int = -1,
             logits_soft_cap: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, q_data_type: Any = "float16",
             kv_data_type: Any = None, o_data_type: Any = None, non_blocking: bool = True,
             prefix_len_ptr: Any = None, token_pos_in_items_ptr: Any = None,
             token_pos_in_items_len: int = 0, max_item_len_ptr: Any = None,
             seq_lens: Any = None, seq_lens_q: Any = None, block_tables: Any = None,
             max_token_per_sequence: Optional[int] = None,
             max_sequence_kv: Optional[int] = None, fixed_split_size: Optional[int] = None,
             disable_split_kv: bool = False, uniform_q_len: Optional[int] = None,
             use_token_head_sf: bool = False, *, num_threads: int = 0) -> None:
        """Plans batch prefill for ragged queries (qo_indptr [B+1]) over a page table
        (paged_kv_indptr [B+1], paged_kv_indices, paged_kv_last_page_len [B]; int32, read on
        the host). A custom mask is a flattened bool [sum qo_len*kv_len] or FlashInfer's packed
        form; ``causal`` is bottom-right aligned. kvattn adds num_threads (keyword)."""
        _refuse(prefix_len_ptr=prefix_len_ptr, token_pos_in_items_ptr=token_pos_in_items_ptr,
                max_item_len_ptr=max_item_len_ptr, seq_lens=seq_lens, seq_lens_q=seq_lens_q,
                block_tables=block_tables)
        qo = host_i32(qo_indptr, "qo_indptr")
        index = {"qo_indptr": qo, "kv_indptr": host_i32(paged_kv_indptr, "paged_kv_indptr"),
                 "kv_indices": host_i32(paged_kv_indices, "paged_kv_indices"),
                 "kv_last_page_len": host_i32(paged_kv_last_page_len, "paged_kv_last_page_len")}
        self._make_plan("batch_prefill_paged", index, int(qo[-1]) if len(qo) else 0,
                        num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, page_size,
                        custom_mask, packed_custom_mask, causal, pos_encoding_mode,
                        use_fp16_qk_reduction, sm_scale, window_left, logits_soft_cap,
                        rope_scale, rope_theta, q_data_type, kv_data_type, o_data_type,
                        _split(fixed_split_size, disable_split_kv, page_size), num_threads,
                        use_token_head_sf)

    begin_forward = plan

    def run(self, q: Any, paged_kv_cache: Union[Any, Tuple[Any, Any]], *args: Any,
            q_scale: Optional[float] = None, k_scale: Optional[float] = None,
            v_scale: Optional[float] = None, out: Any = None, lse: Any = None,
            return_lse: bool = False, lse_base: str = "log2", lse_layout: str = "NH",
            enable_pdl: Optional[bool] = None, window_left: Optional[int] = None,
            sinks: Any = None, kv_cache_sf: Any = None,
            skip_softmax_threshold_scale_factor: Optional[float] = None,
            use_fp16_softmax: Optional[bool] = None, uses_spcompress: Optional[bool] = None
            ) -> Any:
        """Attention of q [qo_indptr[-1], H_qo, D_qk] over the planned pages. Returns out
        [.., H_qo, D_vo] or (out, lse); lse in base 2 unless lse_base="ln"."""
        plan = self._planned(window_left)
        _refuse_run(args, skip_softmax_threshold_scale_factor)
        if use_fp16_softmax:
            raise unsupported("use_fp16_softmax", "kvattn's softmax is fp32")
        if uses_spcompress:
            raise unsupported("uses_spcompress", "not supported by kvattn")
        tensors = cache_tensors(paged_kv_cache, self._kv_layout)
        tensors.update(self._scale_tensors(kv_cache_sf))
        return plan.run(q, tensors, sinks=sinks, out=out,
                        lse=lse, return_lse=return_lse, lse_base=lse_base,
                        lse_layout=lse_layout, q_scale=q_scale,
                        k_scale=k_scale,
                        v_scale=v_scale, workspace=self._workspace)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q: Any, paged_kv_cache: Any, causal: bool = False,
                pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
                k_scale: Optional[float] = None, v_scale: Optional[float] = None,
                window_left: int = -1, logits_soft_cap: Optional[float] = None,
                sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                rope_theta: Optional[float] = None) -> Any:
        """Deprecated (FlashInfer): use `run`. The problem parameters given here replace the
        planned ones, as in FlashInfer (the wrapper plans again where they differ)."""
        self._forward_params(causal=causal, pos_encoding_mode=pos_encoding_mode,
                             use_fp16_qk_reduction=use_fp16_qk_reduction,
                             window_left=window_left, logits_soft_cap=logits_soft_cap,
                             sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta)
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(self, q: Any, paged_kv_cache: Any, causal: bool = False,
                           pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
                           k_scale: Optional[float] = None, v_scale: Optional[float] = None,
                           window_left: int = -1, logits_soft_cap: Optional[float] = None,
                           sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                           rope_theta: Optional[float] = None) -> Tuple[Any, Any]:
        """Deprecated (FlashInfer): use `run_return_lse`; the parameters as for `forward`."""
        self._forward_params(causal=causal, pos_encoding_mode=pos_encoding_mode,
                             use_fp16_qk_reduction=use_fp16_qk_reduction,
                             window_left=window_left, logits_soft_cap=logits_soft_cap,
                             sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta)
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale, return_lse=True)


class BatchPrefillWithRaggedKVCacheWrapper(_PrefillWrapper):
    """Batch prefill: ragged queries (qo_indptr) over ragged K/V (kv_indptr), NHD."""

    def __init__(self, float_workspace_buffer: Any, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, qo_indptr_buf: Any = None,
                 kv_indptr_buf: Any = None, custom_mask_buf: Any = None,
                 mask_indptr_buf: Any = None, backend: str = "auto", jit_args: Any = None,
                 jit_kwargs: Any = None, variant_owns_mask: bool = False) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args,
                         jit_kwargs)

    def plan(self, qo_indptr: Any, kv_indptr: Any, num_qo_heads: int, num_kv_heads: int,
             head_dim_qk: int, head_dim_vo: Optional[int] = None, custom_mask: Any = None,
             packed_custom_mask: Any = None, causal: bool = False,
             pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
             window_left: int = -1, logits_soft_cap: Optional[float] = None,
             sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, q_data_type: Any = "float16",
             kv_data_type: Any = None, o_data_type: Any = None, non_blocking: bool = True,
             prefix_len_ptr: Any = None, token_pos_in_items_ptr: Any = None,
             token_pos_in_items_len: int = 0, max_item_len_ptr: Any = None,
             fixed_split_size: Optional[int] = None, disable_split_kv: bool = False,
             seq_lens: Any = None, seq_lens_q: Any = None,
             max_token_per_sequence: Optional[int] = None,
             max_sequence_kv: Optional[int] = None, v_indptr: Any = None, o_indptr: Any = None,
             qo_indptr_cpu: Any = None, kv_indptr_cpu: Any = None,
             uniform_q_len: Optional[int] = None, use_token_head_sf: bool = False, *,
             num_threads: int = 0) -> None:
        """Plans batch prefill for ragged queries (qo_indptr [B+1]) over ragged keys
        (kv_indptr [B+1]); int32, read on the host. kvattn adds num_threads (keyword)."""
        _refuse(prefix_len_ptr=prefix_len_ptr, token_pos_in_items_ptr=token_pos_in_items_ptr,
                max_item_len_ptr=max_item_len_ptr, seq_lens=seq_lens, seq_lens_q=seq_lens_q,
                v_indptr=v_indptr, o_indptr=o_indptr)
        qo = host_i32(qo_indptr if qo_indptr_cpu is None else qo_indptr_cpu, "qo_indptr")
        kv = host_i32(kv_indptr if kv_indptr_cpu is None else kv_indptr_cpu, "kv_indptr")
        self._make_plan("batch_prefill_ragged", {"qo_indptr": qo, "kv_indptr": kv},
                        int(qo[-1]) if len(qo) else 0, num_qo_heads, num_kv_heads,
                        head_dim_qk, head_dim_vo, None, custom_mask, packed_custom_mask, causal,
                        pos_encoding_mode, use_fp16_qk_reduction, sm_scale, window_left,
                        logits_soft_cap, rope_scale, rope_theta, q_data_type, kv_data_type,
                        o_data_type, _split(fixed_split_size, disable_split_kv), num_threads,
                        use_token_head_sf)

    begin_forward = plan

    def run(self, q: Any, k: Any, v: Any, *args: Any, q_scale: Optional[float] = None,
            k_scale: Optional[float] = None, v_scale: Optional[float] = None,
            o_scale: Optional[float] = None, out: Any = None, lse: Any = None,
            return_lse: bool = False, lse_base: str = "log2", lse_layout: str = "NH",
            enable_pdl: Optional[bool] = None, kv_cache_sf: Any = None) -> Any:
        """Attention of q [qo_indptr[-1], H_qo, D_qk] over k, v [kv_indptr[-1], H_kv, D].
        Returns out or (out, lse); lse in base 2 unless lse_base="ln"."""
        plan = self._planned(None)
        _refuse_run(args)
        if o_scale is not None and float(o_scale) != 1.0:
            raise unsupported("o_scale", "kvattn writes the output unscaled (o_scale 1)")
        tensors = {"k": k, "v": v}
        tensors.update(self._scale_tensors(kv_cache_sf))
        return plan.run(q, tensors, out=out, lse=lse, return_lse=return_lse,
                        lse_base=lse_base, lse_layout=lse_layout,
                        q_scale=q_scale,
                        k_scale=k_scale,
                        v_scale=v_scale, workspace=self._workspace)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q: Any, k: Any, v: Any, causal: bool = False,
                pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
                window_left: int = -1, logits_soft_cap: Optional[float] = None,
                sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                rope_theta: Optional[float] = None) -> Any:
        """Deprecated (FlashInfer): use `run`. The problem parameters given here replace the
        planned ones, as in FlashInfer (the wrapper plans again where they differ)."""
        self._forward_params(causal=causal, pos_encoding_mode=pos_encoding_mode,
                             use_fp16_qk_reduction=use_fp16_qk_reduction,
                             window_left=window_left, logits_soft_cap=logits_soft_cap,
                             sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta)
        return self.run(q, k, v)

    def forward_return_lse(self, q: Any, k: Any, v: Any, causal: bool = False,
                           pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
                           window_left: int = -1, logits_soft_cap: Optional[float] = None,
                           sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                           rope_theta: Optional[float] = None) -> Tuple[Any, Any]:
        """Deprecated (FlashInfer): use `run_return_lse`; the parameters as for `forward`."""
        self._forward_params(causal=causal, pos_encoding_mode=pos_encoding_mode,
                             use_fp16_qk_reduction=use_fp16_qk_reduction,
                             window_left=window_left, logits_soft_cap=logits_soft_cap,
                             sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta)
        return self.run(q, k, v, return_lse=True)


def single_prefill_with_kv_cache(q: Any, k: Any, v: Any, scale_q: Any = None,
                                 scale_k: Any = None, scale_v: Any = None, o_dtype: Any = None,
                                 custom_mask: Any = None, packed_custom_mask: Any = None,
                                 causal: bool = False, kv_layout: str = "NHD",
                                 pos_encoding_mode: str = "NONE",
                                 use_fp16_qk_reduction: bool = False,
                                 sm_scale: Optional[float] = None, window_left: int = -1,
                                 logits_soft_cap: Optional[float] = None,
                                 rope_scale: Optional[float] = None,
                                 rope_theta: Optional[float] = None, backend: str = "auto",
                                 return_lse: bool = False, kv_cache_sf: Any = None,
                                 k_scale: Any = None, v_scale: Any = None) -> Any:
    """Prefill attention of q [qo_len, H_qo, D_qk] over k, v [kv_len, H_kv, D] (NHD) or
    [H_kv, kv_len, D] (HND). Returns out [qo_len, H_qo, D_vo] or (out, lse) (base 2)."""
    check_kv_layout(kv_layout)
    if kv_cache_sf is not None:
        raise unsupported("kv_cache_sf", "block-scaled (NVFP4) caches are not kvattn's")
    if scale_k is not None and k_scale is not None:
        raise InvalidArgumentError("scale_k and k_scale: give one")
    if scale_v is not None and v_scale is not None:
        raise InvalidArgumentError("scale_v and v_scale: give one")
    qd = tensor_dtype_name(q)
    kvd = tensor_dtype_name(k)
    if qd is None or kvd is None:
        raise InvalidArgumentError("q, k: numpy arrays need float32 or float16 here (no dtype "
                                   "is planned for storage-only arrays)")
    _, _, o = resolve_dtypes(qd, kvd, o_dtype)
    mask, packed, causal = _mask_fields(custom_mask, packed_custom_mask, causal)
    kv_heads = k.shape[1] if kv_layout == "NHD" else k.shape[0]
    k_float, v_float, scales = kv_scales(scale_k if scale_k is not None else k_scale,
                                         scale_v if scale_v is not None else v_scale, kv_heads, k)
    fields = problem_fields(
        batch_size=1, num_qo_heads=q.shape[1], num_kv_heads=kv_heads, head_dim_qk=q.shape[2],
        head_dim_vo=v.shape[-1], kv_layout=kv_layout, causal=causal, custom_mask=bool(mask),
        pos_encoding_mode=check_pos_encoding_mode(pos_encoding_mode),
        use_fp16_qk_reduction=bool(use_fp16_qk_reduction),
        sm_scale=None if sm_scale is None else float(sm_scale), window_left=window_left,
        logits_soft_cap=soft_cap(logits_soft_cap),
        rope_scale=1.0 if rope_scale is None else float(rope_scale),
        rope_theta=1e4 if rope_theta is None else float(rope_theta), q_data_type=qd,
        kv_data_type=kvd, o_data_type=o,
        kv_scale_granularity="per_head" if scales else None)
    return run_once("single_prefill", fields, dict({"q": q, "k": k, "v": v}, **mask, **scales),
                    check_backend(backend), q, (q.shape[0], q.shape[1], v.shape[-1]),
                    return_lse, custom_mask_packed=packed, q_scale=scale_value(scale_q),
                    k_scale=k_float, v_scale=v_float)


single_prefill_with_kv_cache_return_lse = functools.partial(single_prefill_with_kv_cache,
                                                            return_lse=True)

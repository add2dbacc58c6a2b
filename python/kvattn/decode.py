"""Decode attention: one (or a few) query tokens per request against its paged KV cache, and the
single-request form. FlashInfer's names, parameters and defaults (flashinfer.decode)."""

from __future__ import annotations

import functools
from typing import Any, Optional, Tuple, Union

import numpy as np

from ._attention import (AttentionPlan, check_backend, check_kv_layout, check_pos_encoding_mode,
                         kv_scales, problem_fields, resolve_dtypes, run_once, scale_caches,
                         scale_value, soft_cap, unsupported)
from ._errors import InvalidArgumentError
from ._tensors import device_of, dtype_name, host_i32, cache_tensors, tensor_dtype_name

# FlashInfer accepts the plan's optional arguments positionally after page_size (deprecated).
_PLAN_LEGACY_POSITIONAL = ("pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type",
                           "kv_data_type", "o_data_type", "data_type", "sm_scale", "rope_scale",
                           "rope_theta", "non_blocking", "block_tables", "seq_lens",
                           "fixed_split_size", "disable_split_kv", "q_len_per_req")

# A chunk longer than any request: no split.
_NO_SPLIT = 1 << 62


class BatchDecodeWithPagedKVCacheWrapper:
    """Batch decode over a paged KV cache: `plan` once per step (reads the page table on the
    host, chooses the backend, cuts the work), `run` once per layer.

    kvattn differences: ``backend`` also takes "cpu" and "reference"; an explicit backend that
    cannot run the planned problem raises at `plan` with the reason; arguments kvattn cannot
    honour raise instead of being ignored."""

    def __init__(self, float_workspace_buffer: Any, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, use_tensor_cores: bool = False,
                 paged_kv_indptr_buffer: Any = None, paged_kv_indices_buffer: Any = None,
                 paged_kv_last_page_len_buffer: Any = None, backend: str = "auto",
                 jit_args: Any = None, jit_kwargs: Any = None) -> None:
        if jit_args is not None or jit_kwargs is not None:
            raise unsupported("jit_args", "kvattn has no JIT-compiled custom variants")
        self._kv_layout = check_kv_layout(kv_layout)
        self._backend = check_backend(backend)
        self._workspace = float_workspace_buffer
        self._device = device_of(float_workspace_buffer)
        self._use_cuda_graph = use_cuda_graph
        # FlashInfer's attribute (engines read it to pick their decode path). kvattn's kernel
        # choice is the backend's (selection), so the flag is recorded, not a kernel switch.
        self.use_tensor_cores = bool(use_tensor_cores)
        self._plan: Optional[AttentionPlan] = None
        self._cached_o_data_type: Optional[str] = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer: Any,
                               int_workspace_buffer: Any) -> None:
        self._workspace = float_workspace_buffer

    def plan(self, indptr: Any, indices: Any, last_page_len: Any, num_qo_heads: int,
             num_kv_heads: int, head_dim: int, page_size: int, *deprecated_positional_args: Any,
             **kwargs: Any) -> None:
        """Plans batch decode for a page table (``indptr`` [B+1], ``indices``, ``last_page_len``
        [B], int32). Keywords as FlashInfer's: pos_encoding_mode, window_left, logits_soft_cap,
        q_data_type, kv_data_type, o_data_type, data_type (deprecated), sm_scale, rope_scale,
        rope_theta, non_blocking, fixed_split_size (pages), disable_split_kv, q_len_per_req,
        is_causal; kvattn adds num_threads (CPU threads, 0 = all)."""
        if len(deprecated_positional_args) > len(_PLAN_LEGACY_POSITIONAL):
            raise TypeError(f"plan() takes at most {7 + len(_PLAN_LEGACY_POSITIONAL)} positional "
                            "arguments")
        for name, value in zip(_PLAN_LEGACY_POSITIONAL, deprecated_positional_args):
            if name in kwargs:
                raise TypeError(f"plan() got multiple values for argument '{name}'")
            kwargs[name] = value
        self._plan_impl(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                        page_size, **kwargs)

    begin_forward = plan

    def _plan_impl(self, indptr: Any, indices: Any, last_page_len: Any, num_qo_heads: int,
                   num_kv_heads: int, head_dim: int, page_size: int, *,
                   pos_encoding_mode: str = "NONE", window_left: int = -1,
                   window_right: int = 0, logits_soft_cap: Optional[float] = None,
                   q_data_type: Any = "float16", kv_data_type: Any = None,
                   o_data_type: Any = None, data_type: Any = None,
                   sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                   rope_theta: Optional[float] = None, non_blocking: bool = True,
                   block_tables: Any = None, seq_lens: Any = None,
                   fixed_split_size: Optional[int] = None, disable_split_kv: bool = False,
                   q_len_per_req: int = 1, is_causal: Optional[bool] = None,
                   use_token_head_sf: bool = False, num_threads: int = 0) -> None:
        # What this plan was made from (the deprecated forward() may replan with other
        # problem parameters, as FlashInfer's forward sets them for run).
        self._plan_args = {k: v for k, v in locals().items() if k != "self"}
        if window_right != 0:
            raise unsupported("window_right", f"{window_right}: kvattn's window is left-only "
                              "(keys after the query are masked only by causality)")
        if block_tables is not None or seq_lens is not None:
            raise unsupported("block_tables", "kvattn reads the CSR page table (indptr, indices, "
                              "last_page_len); block_tables/seq_lens are trtllm-gen's form")
        if q_len_per_req is None:
            q_len_per_req = 1
        if q_len_per_req < 1:
            # FlashInfer's tests match "q_len_per_req must be >= 1"
            raise InvalidArgumentError(
                f"q_len_per_req must be >= 1 (q_len_per_req = {q_len_per_req})")
        causal = (q_len_per_req > 1) if is_causal is None else bool(is_causal)
        if causal and q_len_per_req == 1 and is_causal is not None:
            causal = False  # one query row: causal and non-causal are the same mask
        q, kv, o = resolve_dtypes(q_data_type, kv_data_type, o_data_type, data_type)
        kv_indptr = host_i32(indptr, "indptr")
        index = {"kv_indptr": kv_indptr, "kv_indices": host_i32(indices, "indices"),
                 "kv_last_page_len": host_i32(last_page_len, "last_page_len")}
        batch = max(len(kv_indptr) - 1, 0)
        op = "batch_decode"
        if q_len_per_req > 1:
            # Several query tokens per request (speculative decoding): a ragged prefill of
            # q_len_per_req rows per request over the same pages.
            op = "batch_prefill_paged"
            index["qo_indptr"] = np.arange(batch + 1, dtype=np.int32) * q_len_per_req
        chunk = 0
        if disable_split_kv:
            chunk = _NO_SPLIT
        elif fixed_split_size is not None and fixed_split_size > 0:
            chunk = int(fixed_split_size) * int(page_size)
        fields = problem_fields(
            batch_size=batch, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
            head_dim_qk=head_dim, head_dim_vo=head_dim, page_size=page_size,
            kv_layout=self._kv_layout, pos_encoding_mode=check_pos_encoding_mode(pos_encoding_mode),
            window_left=window_left, logits_soft_cap=soft_cap(logits_soft_cap),
            sm_scale=None if sm_scale is None else float(sm_scale),
            rope_scale=1.0 if rope_scale is None else float(rope_scale),
            rope_theta=1e4 if rope_theta is None else float(rope_theta),
            q_data_type=q, kv_data_type=kv, o_data_type=o,
            causal=causal if op == "batch_prefill_paged" else None,
            kv_scale_granularity="per_token_head" if use_token_head_sf else None)
        self._plan = AttentionPlan(op, fields, index, self._backend, self._device,
                                   batch * q_len_per_req, num_threads=num_threads,
                                   kv_chunk_size=chunk)
        self._q_dtype, self._kv_dtype = q, kv
        self._cached_o_data_type = o
        self._window_left = window_left
        self._use_token_head_sf = bool(use_token_head_sf)

    @property
    def backend(self) -> Optional[str]:
        """The backend the last plan chose."""
        return None if self._plan is None else self._plan.backend

    def run(self, q: Any, paged_kv_cache: Union[Any, Tuple[Any, Any]], *args: Any,
            q_scale: Optional[float] = None, k_scale: Optional[float] = None,
            v_scale: Optional[float] = None, out: Any = None, lse: Any = None,
            return_lse: bool = False, enable_pdl: Optional[bool] = None,
            window_left: Optional[int] = None, sinks: Any = None,
            q_len_per_req: Optional[int] = None,
            skip_softmax_threshold_scale_factor: Optional[float] = None,
            kv_cache_sf: Any = None) -> Any:
        """Decode attention of q [B * q_len_per_req, H_qo, D] over the planned pages. Returns
        out [.., H_qo, D] (o_data_type) or (out, lse) with lse in base 2."""
        plan = self._planned()
        if args:
            raise unsupported("args", "kvattn has no custom-kernel arguments")
        if window_left is not None and window_left != self._window_left:
            raise InvalidArgumentError(
                f"window_left = {window_left}: differs from the planned {self._window_left} "
                "(plan again for another window)")
        if skip_softmax_threshold_scale_factor is not None:
            raise unsupported("skip_softmax_threshold_scale_factor",
                              "kvattn computes exact softmax")
        tensors = cache_tensors(paged_kv_cache, self._kv_layout)
        if self._use_token_head_sf:
            if kv_cache_sf is None:
                raise InvalidArgumentError("kv_cache_sf: required, the plan has "
                                           "use_token_head_sf=True")
            tensors.update(scale_caches(kv_cache_sf, self._kv_layout))
        elif kv_cache_sf is not None:
            raise unsupported("kv_cache_sf", "given without use_token_head_sf=True at plan "
                              "(NVFP4 block scales are not kvattn's)")
        return plan.run(q, tensors, sinks=sinks, out=out,
                        lse=lse, return_lse=return_lse, q_scale=q_scale,
                        k_scale=k_scale,
                        v_scale=v_scale, workspace=self._workspace)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q: Any, paged_kv_cache: Any, pos_encoding_mode: str = "NONE",
                q_scale: Optional[float] = None, k_scale: Optional[float] = None,
                v_scale: Optional[float] = None, window_left: int = -1,
                logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
                rope_scale: Optional[float] = None, rope_theta: Optional[float] = None) -> Any:
        """Deprecated (FlashInfer): use `run`. The problem parameters given here replace the
        planned ones, as in FlashInfer (the wrapper plans again where they differ)."""
        self._forward_params(pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                             logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                             rope_scale=rope_scale, rope_theta=rope_theta)
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(self, q: Any, paged_kv_cache: Any, pos_encoding_mode: str = "NONE",
                           q_scale: Optional[float] = None, k_scale: Optional[float] = None,
                           v_scale: Optional[float] = None, window_left: int = -1,
                           logits_soft_cap: Optional[float] = None,
                           sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                           rope_theta: Optional[float] = None) -> Tuple[Any, Any]:
        """Deprecated (FlashInfer): use `run_return_lse`; the parameters as for `forward`."""
        self._forward_params(pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                             logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                             rope_scale=rope_scale, rope_theta=rope_theta)
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                        return_lse=True)

    def _forward_params(self, **params: Any) -> None:
        """Plans again with the deprecated forward()'s problem parameters where they differ
        from the plan's (FlashInfer's forward sets them on the wrapper for run)."""
        self._planned()
        args = self._plan_args
        if all(args[k] == v for k, v in params.items()):
            return
        self._plan_impl(**dict(args, **params))

    def end_forward(self) -> None:
        """Deprecated no-op (FlashInfer)."""

    def _planned(self) -> AttentionPlan:
        if self._plan is None:
            raise InvalidArgumentError("run before plan: call plan() first")
        return self._plan


def fast_decode_plan(self: BatchDecodeWithPagedKVCacheWrapper, indptr: Any, indices: Any,
                     last_page_len: Any, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                     page_size: int, pos_encoding_mode: str = "NONE", window_left: int = -1,
                     logits_soft_cap: Optional[float] = None, q_data_type: Any = None,
                     kv_data_type: Any = None, data_type: Any = None,
                     sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                     rope_theta: Optional[float] = None, non_blocking: bool = True,
                     fixed_split_size: Optional[int] = None, disable_split_kv: bool = False,
                     q_len_per_req: int = 1, global_override_indptr_cpu: Any = None) -> None:
    """FlashInfer's fast_decode_plan (SGLang binds it as ``wrapper.plan``): the wrapper's plan
    with every keyword honoured. In FlashInfer it skips device copies of CUDA-graph buffers;
    kvattn's plan reads the page table on the host either way, so it is the same plan.
    global_override_indptr_cpu, when given, is the indptr planned with (a host copy of indptr);
    q_data_type None means data_type or float16, and o_data_type is the previous plan's."""
    if not isinstance(self, BatchDecodeWithPagedKVCacheWrapper):
        raise InvalidArgumentError(
            f"fast_decode_plan: self is {type(self).__name__}: must be a "
            "BatchDecodeWithPagedKVCacheWrapper")
    self._plan_impl(
        indptr if global_override_indptr_cpu is None else global_override_indptr_cpu, indices,
        last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
        pos_encoding_mode=pos_encoding_mode, window_left=window_left,
        logits_soft_cap=logits_soft_cap,
        q_data_type=q_data_type if q_data_type is not None else (data_type or "float16"),
        kv_data_type=kv_data_type, data_type=data_type,
        o_data_type=self._cached_o_data_type, sm_scale=sm_scale, rope_scale=rope_scale,
        rope_theta=rope_theta, non_blocking=non_blocking, fixed_split_size=fixed_split_size,
        disable_split_kv=disable_split_kv, q_len_per_req=q_len_per_req)


def single_decode_with_kv_cache(q: Any, k: Any, v: Any, kv_layout: str = "NHD",
                                pos_encoding_mode: str = "NONE", use_tensor_cores: bool = False,
                                q_scale: Any = None, k_scale: Any = None, v_scale: Any = None,
                                window_left: int = -1,
                                logits_soft_cap: Optional[float] = None,
                                sm_scale: Optional[float] = None,
                                rope_scale: Optional[float] = None,
                                rope_theta: Optional[float] = None,
                                return_lse: bool = False) -> Any:
    """Decode attention of one query token q [H_qo, D] over k, v [kv_len, H_kv, D] (NHD) or
    [H_kv, kv_len, D] (HND). Returns out [H_qo, D] in q's dtype, or (out, lse) (lse base 2)."""
    check_kv_layout(kv_layout)
    qd = tensor_dtype_name(q)
    kvd = tensor_dtype_name(k)
    if qd is None or kvd is None:
        raise InvalidArgumentError("q, k: numpy arrays need float32 or float16 here (no dtype "
                                   "is planned for storage-only arrays)")
    o = "bf16" if qd in ("e4m3", "e5m2") else qd
    heads = q.shape[0] if len(q.shape) == 2 else -1
    kv_heads = k.shape[1] if kv_layout == "NHD" else k.shape[0]
    k_float, v_float, scales = kv_scales(k_scale, v_scale, kv_heads, k)
    fields = problem_fields(
        batch_size=1, num_qo_heads=heads, num_kv_heads=kv_heads, head_dim_qk=q.shape[-1],
        head_dim_vo=v.shape[-1], kv_layout=kv_layout,
        pos_encoding_mode=check_pos_encoding_mode(pos_encoding_mode), window_left=window_left,
        logits_soft_cap=soft_cap(logits_soft_cap),
        sm_scale=None if sm_scale is None else float(sm_scale),
        rope_scale=1.0 if rope_scale is None else float(rope_scale),
        rope_theta=1e4 if rope_theta is None else float(rope_theta), q_data_type=qd,
        kv_data_type=kvd, o_data_type=o,
        kv_scale_granularity="per_head" if scales else None)
    return run_once("single_decode", fields, dict({"q": q, "k": k, "v": v}, **scales), "auto", q,
                    (heads, v.shape[-1]), return_lse, q_scale=scale_value(q_scale),
                    k_scale=k_float, v_scale=v_float)


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """FlashInfer's CUDA-graph decode wrapper: BatchDecodeWithPagedKVCacheWrapper with
    use_cuda_graph=True and the page-table buffers given up front."""

    def __init__(self, workspace_buffer: Any, indptr_buffer: Any, indices_buffer: Any,
                 last_page_len_buffer: Any, kv_layout: str = "NHD",
                 use_tensor_cores: bool = False) -> None:
        super().__init__(workspace_buffer, kv_layout, True, use_tensor_cores, indptr_buffer,
                         indices_buffer, last_page_len_buffer)

"""Multi-head latent attention (DeepSeek-V2/V3/R1, Kimi-K2) over paged latent caches: FlashInfer's
BatchMLAPagedAttentionWrapper (flashinfer.mla). Every head reads the same latent per token:
ckv [D_ckv] (512) and kpe [D_kpe] (64); the query is q_nope [H, D_ckv] and q_pe [H, D_kpe];
the output is [H, D_ckv]."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ._attention import AttentionPlan, check_backend, problem_fields, resolve_dtypes, unsupported
from ._errors import InvalidArgumentError
from ._tensors import device_of, host_i32


class BatchMLAPagedAttentionWrapper:
    """Paged MLA: `plan` once per step with the page table (kv_indptr, kv_indices and each
    request's KV length kv_len_arr), `run` per layer on q_nope, q_pe and the latent caches
    ckv_cache [P, page_size, D_ckv], kpe_cache [P, page_size, D_kpe]. sm_scale is required (the
    model's 1/sqrt(192)·mscale², there is no default)."""

    def __init__(self, float_workspace_buffer: Any, use_cuda_graph: bool = False,
                 qo_indptr: Any = None, kv_indptr: Any = None, kv_indices: Any = None,
                 kv_len_arr: Any = None, backend: str = "auto") -> None:
        self._backend = check_backend(backend)
        self._workspace = float_workspace_buffer
        self._device = device_of(float_workspace_buffer)
        self._plan: Optional[AttentionPlan] = None
        self._k_scale = 1.0

    @property
    def backend(self) -> Optional[str]:
        return None if self._plan is None else self._plan.backend

    def plan(self, qo_indptr: Any = None, kv_indptr: Any = None, kv_indices: Any = None,
             kv_len_arr: Any = None, num_heads: Optional[int] = None,
             head_dim_ckv: Optional[int] = None, head_dim_kpe: Optional[int] = None,
             page_size: Optional[int] = None, causal: Optional[bool] = None,
             sm_scale: Optional[float] = None, q_data_type: Any = None,
             kv_data_type: Any = None, use_profiler: bool = False, *, metadata: Any = None,
             cum_seq_lens_q: Any = None, block_tables: Any = None, seq_lens: Any = None,
             max_q_len: Optional[int] = None, query_layout: Any = None,
             kv_cache_layout: Any = None, lse_mode: str = "none", output_dtype: Any = None,
             output_scale: str = "none", scale_mode: str = "default", skip_softmax: bool = False,
             enable_pdl: Optional[bool] = None, use_sinks: bool = False,
             num_threads: int = 0) -> None:
        """Plans MLA for ragged queries (qo_indptr [B+1]) over a page table (kv_indptr [B+1],
        kv_indices) with kv_len_arr [B] keys per request. kvattn adds num_threads (keyword)."""
        for name, value in (("metadata", metadata), ("cum_seq_lens_q", cum_seq_lens_q),
                            ("block_tables", block_tables), ("seq_lens", seq_lens),
                            ("query_layout", query_layout), ("kv_cache_layout", kv_cache_layout),
                            ("output_dtype", output_dtype)):
            if value is not None:
                raise unsupported(name, "trtllm-gen / cute-dsl MLA arguments are not kvattn's")
        if use_profiler or skip_softmax:
            raise unsupported("use_profiler/skip_softmax", "not defined for kvattn's MLA")
        if output_scale != "none" or scale_mode != "default" or lse_mode != "none":
            raise unsupported("output_scale/scale_mode/lse_mode", "not kvattn's MLA options "
                              "(ask for the LSE with run(return_lse=True))")
        for name, value in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr),
                            ("kv_indices", kv_indices), ("kv_len_arr", kv_len_arr),
                            ("num_heads", num_heads), ("head_dim_ckv", head_dim_ckv),
                            ("head_dim_kpe", head_dim_kpe), ("page_size", page_size)):
            if value is None:
                raise InvalidArgumentError(f"{name}: required")
        if sm_scale is None:
            raise InvalidArgumentError("sm_scale: required for MLA (the model's "
                                       "1/sqrt(192)·mscale²; there is no default)")
        qo = host_i32(qo_indptr, "qo_indptr")
        pages = host_i32(kv_indptr, "kv_indptr")
        lens = host_i32(kv_len_arr, "kv_len_arr").astype(np.int64)
        # FlashInfer's batch size is qo_indptr's (B + 1 entries); engines size kv_indptr and
        # kv_len_arr for the largest batch, and the entries past B are not read.
        batch = max(len(qo) - 1, 0)
        if len(pages) < batch + 1 or len(lens) < batch:
            raise InvalidArgumentError(
                f"kv_indptr: {len(pages)} entries, kv_len_arr: {len(lens)}: must be at least "
                f"B + 1 = {batch + 1} and B = {batch} (B from qo_indptr)")
        pages, lens = pages[:batch + 1], lens[:batch]
        counts = pages[1:].astype(np.int64) - pages[:-1]
        if np.any(lens > counts * page_size) or np.any((lens <= (counts - 1) * page_size) &
                                                        (counts > 0)) or np.any(
                                                            (lens > 0) & (counts == 0)):
            raise InvalidArgumentError(
                "kv_len_arr: each request's length must fill its pages: (pages - 1) * page_size "
                "< kv_len <= pages * page_size")
        last = np.where(counts > 0, lens - (counts - 1) * page_size, 0).astype(np.int32)
        q, kv, o = resolve_dtypes(q_data_type or "bfloat16", kv_data_type, None)
        fields = problem_fields(batch_size=batch, num_qo_heads=num_heads,
                                head_dim_ckv=head_dim_ckv, head_dim_kpe=head_dim_kpe,
                                page_size=page_size, causal=bool(causal),
                                sm_scale=float(sm_scale), q_data_type=q, kv_data_type=kv,
                                o_data_type=o, use_sinks=bool(use_sinks))
        index = {"qo_indptr": qo, "kv_indptr": pages, "kv_indices": host_i32(kv_indices,
                                                                            "kv_indices"),
                 "kv_last_page_len": last}
        self._plan = AttentionPlan("batch_mla_paged", fields, index, self._backend, self._device,
                                   int(qo[-1]) if len(qo) else 0, num_threads=num_threads)

    def run(self, q_nope: Any = None, q_pe: Any = None, ckv_cache: Any = None,
            kpe_cache: Any = None, out: Any = None, lse: Any = None, return_lse: bool = False,
            profiler_buffer: Any = None, kv_len: Any = None, page_table: Any = None,
            return_lse_base_on_e: bool = False, o_scale: Optional[float] = None, *,
            query: Any = None, kv_cache: Any = None, ckv_scale: Optional[float] = None,
            ckv_scale_arr: Any = None, kpe_scale: Optional[float] = None, sinks: Any = None,
            skip_softmax_threshold_scale_factor: Optional[float] = None,
            bmm1_scale: Optional[float] = None, bmm2_scale: Optional[float] = None) -> Any:
        """MLA of q_nope [N, H, D_ckv], q_pe [N, H, D_kpe] over the planned latent pages.
        Returns out [N, H, D_ckv] (q's dtype) or (out, lse) (base 2, or natural with
        return_lse_base_on_e). An FP8 cache takes its dequantization scale as ckv_scale (it
        scales ckv and kpe alike)."""
        if self._plan is None:
            raise InvalidArgumentError("run before plan: call plan() first")
        for name, value in (("profiler_buffer", profiler_buffer), ("kv_len", kv_len),
                            ("page_table", page_table), ("query", query),
                            ("kv_cache", kv_cache), ("ckv_scale_arr", ckv_scale_arr),
                            ("bmm1_scale", bmm1_scale),
                            ("bmm2_scale", bmm2_scale),
                            ("skip_softmax_threshold_scale_factor",
                             skip_softmax_threshold_scale_factor)):
            if value is not None:
                raise unsupported(name, "not an argument of kvattn's MLA")
        if o_scale is not None and float(o_scale) != 1.0:
            raise unsupported("o_scale", "kvattn writes the output unscaled")
        if kpe_scale is not None and ckv_scale is not None and kpe_scale != ckv_scale:
            raise unsupported("kpe_scale", "kvattn's MLA scales ckv and kpe by one k_scale")
        scale = ckv_scale if ckv_scale is not None else kpe_scale
        if q_nope is None or q_pe is None or ckv_cache is None or kpe_cache is None:
            raise InvalidArgumentError("q_nope, q_pe, ckv_cache, kpe_cache: required")
        plan = self._plan
        shape = (plan.nnz_qo, plan.num_qo_heads, plan.head_dim_vo)
        return plan.run(q_nope, {"q_pe": q_pe, "ckv_cache": ckv_cache, "kpe_cache": kpe_cache},
                        out=out, lse=lse, return_lse=return_lse,
                        lse_base="ln" if return_lse_base_on_e else "log2",
                        k_scale=None if scale is None else float(scale), sinks=sinks,
                        workspace=self._workspace, out_shape=shape, q_key="q_nope")

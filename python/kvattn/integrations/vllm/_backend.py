"""The vLLM attention backend over kvattn (imported with vLLM; see kvattn.integrations.vllm).

The cache vLLM allocates per layer is [num_blocks, num_kv_heads, block_size, 2 * head_size]
(layout LBHNC, FP8 as uint8); kvattn reads and writes it in place as two HND views, K =
kv[..., :D] and V = kv[..., D:] (kvattn honours the strides, nothing is copied). The page table
of a step is derived from vLLM's CommonAttentionMetadata as vLLM's FlashInfer builder derives
it: pages = ceil(seq_len / N), kv_indptr their cumulative sum, kv_indices the first pages of
each row of the block table, last_page_len = seq_len - (pages - 1) * N, qo_indptr =
query_start_loc. vLLM reorders the batch so decode rows (one query token) come first; they are
planned on kvattn's decode wrapper, the remaining rows (prefill chunks, prefix-cache hits,
extends) on its paged prefill wrapper, once per step for all layers of the KV cache group."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Tuple

import numpy as np
import torch

from vllm.config import VllmConfig, get_layers_from_vllm_config
from vllm.model_executor.layers.attention import Attention
from vllm.v1.attention.backend import (AttentionBackend, AttentionCGSupport, AttentionImpl,
                                       AttentionLayer, AttentionMetadataBuilder, AttentionType,
                                       CommonAttentionMetadata, MultipleOf)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheLayout

import kvattn

from . import _cache_updates, _forward_runs, _lock, _plans

# vLLM's cache dtype names -> the torch dtype kvattn reads the cache as ("auto": the model's).
_FP8_CACHE = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
              "fp8_e5m2": torch.float8_e5m2}
_CACHE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                 **_FP8_CACHE}
_DTYPE_TEXT = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
               torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}


def _cache_dtype(kv_cache_dtype: Optional[str], model_dtype: torch.dtype) -> torch.dtype:
    if kv_cache_dtype in (None, "auto"):
        return model_dtype
    if kv_cache_dtype not in _CACHE_DTYPES:
        raise kvattn.NotSupportedError(
            f"kv_cache_dtype = {kv_cache_dtype!r}: kvattn serves auto, float16, bfloat16, fp8, "
            "fp8_e4m3 and fp8_e5m2 caches")
    return _CACHE_DTYPES[kv_cache_dtype]


def _verdict(op: str, **problem: Any) -> Optional[str]:
    """None when kvattn's CPU backend can run the problem, else its reason (the C++
    capability check is the only authority on what kvattn supports)."""
    report = kvattn.explain(op, device="cpu", **problem)
    for verdict in report["verdicts"]:
        if verdict["backend"] == "cpu":
            return None if verdict["supported"] else f"kvattn: {verdict['reason']}"
    return "kvattn: this build has no CPU backend"


def _problem(num_qo_heads: int, num_kv_heads: int, head_size: int, page_size: int,
             dtype: torch.dtype, cache_dtype: torch.dtype, window_left: int = -1,
             logits_soft_cap: float = 0.0) -> Dict[str, Any]:
    return dict(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim_qk=head_size,
                head_dim_vo=head_size, page_size=page_size, kv_layout="HND",
                q_data_type=_DTYPE_TEXT[dtype], kv_data_type=_DTYPE_TEXT[cache_dtype],
                o_data_type=_DTYPE_TEXT[dtype], window_left=window_left,
                logits_soft_cap=logits_soft_cap)


class KvattnAttentionBackend(AttentionBackend):
    """vLLM's contract (vllm/v1/attention/backend.py) for kvattn's CPU kernels."""

    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[List[torch.dtype]] = [torch.float16, torch.bfloat16,
                                                     torch.float32]
    supported_kv_cache_dtypes: ClassVar[List[str]] = ["auto", "float16", "bfloat16", "fp8",
                                                      "fp8_e4m3", "fp8_e5m2"]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type:
        return KvattnAttentionImpl

    @staticmethod
    def get_builder_cls() -> type:
        return KvattnMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> List[Any]:
        # kvattn's paged kernels take any page size; whether one is served is kvattn's capability
        # check's call (supports_combination).
        return [MultipleOf(1)]

    @classmethod
    def supported_kv_cache_layouts(cls) -> Tuple[KVCacheLayout, ...]:
        # per layer [blocks, kv_heads, block_size, 2 * head_size]: K and V are HND views
        return (KVCacheLayout.LBHNC,)

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_batch_invariance(cls) -> bool:
        # kvattn's CPU split of the keys depends on the batch (num_threads and lengths), so a
        # request's result may change in its last bits with the batch it runs in.
        return False

    @classmethod
    def supports_kv_connector(cls) -> bool:
        return False

    @classmethod
    def supports_combination(cls, head_size: int, dtype: torch.dtype,
                             kv_cache_dtype: Optional[str], block_size: Optional[int],
                             use_mla: bool, has_sink: bool, use_sparse: bool,
                             use_mm_prefix: bool, device_capability: Any) -> Optional[str]:
        if use_mla or use_sparse or dtype not in cls.supported_dtypes:
            return None  # reported by validate_configuration's own checks
        try:
            cache = _cache_dtype(kv_cache_dtype, dtype)
        except kvattn.NotSupportedError as e:
            return str(e)
        # The head counts are not known at selection; the builder asks again with the layers'.
        page = 16 if block_size is None else block_size
        return (_verdict("batch_prefill_paged", causal=True,
                         **_problem(1, 1, head_size, page, dtype, cache))
                or _verdict("batch_decode", **_problem(1, 1, head_size, page, dtype, cache)))


@dataclass
class _Plans:
    """The two plans of one step for layers that share their hyperparameters."""
    decode: Optional[kvattn.BatchDecodeWithPagedKVCacheWrapper]
    prefill: Optional[kvattn.BatchPrefillWithPagedKVCacheWrapper]


@dataclass
class KvattnMetadata:
    num_actual_tokens: int
    num_decodes: int
    num_decode_tokens: int
    # one pair of plans per distinct (num_qo_heads, sm_scale, window_left, soft cap) of the group
    plans: Dict[Tuple[Any, ...], _Plans] = field(default_factory=dict)


def _layer_key(impl: "KvattnAttentionImpl") -> Tuple[Any, ...]:
    return (impl.num_heads, impl.scale, impl.window_left, impl.logits_soft_cap)


class KvattnMetadataBuilder(AttentionMetadataBuilder[KvattnMetadata]):
    """Plans kvattn once per step for all layers of one KV cache group."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER
    reorder_batch_threshold: Optional[int] = 1

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: List[str],
                 vllm_config: VllmConfig, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=False)
        self.page_size = kv_cache_spec.block_size
        self.num_kv_heads = kv_cache_spec.num_kv_heads
        self.head_size = kv_cache_spec.head_size
        self.dtype = vllm_config.model_config.dtype
        self.cache_dtype = _cache_dtype(vllm_config.cache_config.cache_dtype, self.dtype)
        layers = get_layers_from_vllm_config(vllm_config, Attention, layer_names)
        self.keys: List[Tuple[Any, ...]] = []
        for name, layer in layers.items():
            impl = layer.impl
            if not isinstance(impl, KvattnAttentionImpl):
                raise kvattn.NotSupportedError(
                    f"layer {name}: its impl is {type(impl).__name__}; one KV cache group must "
                    "be served by one backend")
            key = _layer_key(impl)
            if key not in self.keys:
                self.keys.append(key)
                num_heads, _, window_left, soft_cap = key
                problem = _problem(num_heads, self.num_kv_heads, self.head_size,
                                   self.page_size, self.dtype, self.cache_dtype, window_left,
                                   soft_cap)
                reason = (_verdict("batch_prefill_paged", causal=True, **problem)
                          or _verdict("batch_decode", **problem))
                if reason is not None:
                    raise kvattn.NotSupportedError(f"layer {name}: {reason}")
        self.workspace = torch.empty(0, dtype=torch.uint8)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> KvattnMetadata:
        m = common_attn_metadata
        if isinstance(m.causal, torch.Tensor):
            raise kvattn.NotSupportedError(
                "per-request dynamic causal masks: not served by kvattn's vLLM backend")
        if not m.causal:
            raise kvattn.NotSupportedError("non-causal attention: not served by kvattn's vLLM "
                                           "backend")
        num_reqs = m.num_reqs
        n = self.page_size
        qo_indptr = m.query_start_loc_cpu[:num_reqs + 1].numpy().astype(np.int32)
        seq_lens = m.seq_lens[:num_reqs].cpu().numpy().astype(np.int64)
        pages = (seq_lens + n - 1) // n
        kv_indptr = np.zeros(num_reqs + 1, dtype=np.int32)
        np.cumsum(pages, out=kv_indptr[1:])
        block_table = m.block_table_tensor[:num_reqs].cpu().numpy()
        if num_reqs:
            width = int(pages.max())
            used = np.arange(width)[None, :] < pages[:, None]
            kv_indices = np.ascontiguousarray(block_table[:, :width][used], dtype=np.int32)
        else:
            kv_indices = np.zeros(0, dtype=np.int32)
        last_page_len = (seq_lens - np.maximum(pages - 1, 0) * n).astype(np.int32)
        num_decodes, _, num_decode_tokens, _ = split_decodes_and_prefills(
            m, decode_threshold=1)
        if num_decode_tokens != num_decodes:  # a row without queries among them: no decode plan
            num_decodes = num_decode_tokens = 0
        threads = torch.get_num_threads()
        meta = KvattnMetadata(num_actual_tokens=m.num_actual_tokens, num_decodes=num_decodes,
                              num_decode_tokens=num_decode_tokens)
        d = num_decodes
        made = 0
        for key in self.keys:
            num_heads, scale, window_left, soft_cap = key
            decode = prefill = None
            common = dict(window_left=window_left, logits_soft_cap=soft_cap or None,
                          sm_scale=scale, q_data_type=self.dtype, kv_data_type=self.cache_dtype,
                          o_data_type=self.dtype, num_threads=threads)
            if d > 0:
                decode = kvattn.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "HND")
                decode.plan(kv_indptr[:d + 1], kv_indices[:kv_indptr[d]], last_page_len[:d],
                            num_heads, self.num_kv_heads, self.head_size, n, **common)
                made += 1
            if d < num_reqs:
                prefill = kvattn.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "HND")
                prefill.plan(qo_indptr[d:] - qo_indptr[d], kv_indptr[d:] - kv_indptr[d],
                             kv_indices[kv_indptr[d]:], last_page_len[d:], num_heads,
                             self.num_kv_heads, self.head_size, n, causal=True, **common)
                made += 1
            meta.plans[key] = _Plans(decode, prefill)
        with _lock:
            _plans[0] += made
        return meta


class KvattnAttentionImpl(AttentionImpl[KvattnMetadata]):
    """Writes K/V into vLLM's cache (do_kv_cache_update) and runs the step's plans (forward)."""

    def __init__(self, num_heads: int, head_size: int, scale: float,
                 num_kv_heads: Optional[int] = None, alibi_slopes: Optional[List[float]] = None,
                 sliding_window: Optional[int] = None, kv_cache_dtype: str = "auto",
                 logits_soft_cap: Optional[float] = None,
                 attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: Optional[str] = None,
                 sinks: Optional[torch.Tensor] = None) -> None:
        if alibi_slopes is not None:
            raise kvattn.NotSupportedError(
                "ALiBi: not served by kvattn's vLLM backend (its wrappers take no slopes)")
        if attn_type != AttentionType.DECODER:
            raise kvattn.NotSupportedError(
                f"attention type {attn_type}: kvattn's vLLM backend serves decoder "
                "self-attention only (no encoder, encoder-only or cross attention)")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.sliding_window = sliding_window
        # vLLM's window of W tokens includes the query's own: FlashInfer's window_left = W - 1
        self.window_left = -1 if sliding_window is None else int(sliding_window) - 1
        self.logits_soft_cap = 0.0 if not logits_soft_cap else float(logits_soft_cap)
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.sinks = sinks
        self._sinks_f32: Optional[torch.Tensor] = None
        if sinks is not None and sinks.shape[0] != num_heads:
            raise kvattn.InvalidShapeError(
                f"sinks: {sinks.shape[0]} values, expected one per query head ({num_heads})")
        self._fp8 = _FP8_CACHE.get(kv_cache_dtype)
        self._arange = torch.arange(0, dtype=torch.int32)

    def _caches(self, kv_cache: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if self._fp8 is not None and kv_cache.dtype == torch.uint8:
            kv_cache = kv_cache.view(self._fp8)
        d = self.head_size
        return kv_cache[..., :d], kv_cache[..., d:]

    def do_kv_cache_update(self, layer: torch.nn.Module, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        n = slot_mapping.shape[0]
        if n == 0 or kv_cache.numel() == 0:
            return
        slots = slot_mapping
        key, value = key[:n], value[:n]
        block = kv_cache.shape[2]
        # Each token is its own one-page "request": page slot // N, position slot % N. A padded
        # row (slot -1, as vLLM pads a CUDA-graph batch) gets batch index -1, which kvattn's
        # append writes nowhere (FlashInfer's convention, kvattn::kPaddedAppendRow); its
        # one-page request points at page 0, position 0, so every table entry stays in range.
        # No filtering copy, no host-side test of the slots.
        if self._arange.shape[0] < n + 1:
            self._arange = torch.arange(max(n + 1, 2 * self._arange.shape[0]),
                                        dtype=torch.int32)
        padded = slots < 0
        live = slots.clamp(min=0)
        pages = torch.div(live, block, rounding_mode="floor").to(torch.int32)
        positions = (live - pages.to(live.dtype) * block).to(torch.int32)
        batch = torch.where(padded, -1, self._arange[:n])
        last = torch.full((n,), block, dtype=torch.int32)
        kvattn.append_paged_kv_cache(key, value, batch, positions,
                                     self._caches(kv_cache), pages, self._arange[:n + 1], last,
                                     kv_layout="HND", k_scale=layer._k_scale_float,
                                     v_scale=layer._v_scale_float)
        with _lock:
            _cache_updates[layer.layer_name] += 1

    def forward(self, layer: AttentionLayer, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: Optional[KvattnMetadata], output: torch.Tensor,
                output_scale: Optional[torch.Tensor] = None,
                output_block_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise kvattn.NotSupportedError(
                "fused output quantization: not served by kvattn's vLLM backend")
        if attn_metadata is None:  # warm-up / profiling run: no cache, nothing to attend
            return output
        plans = attn_metadata.plans[_layer_key(self)]
        caches = self._caches(kv_cache)
        sinks = None
        if self.sinks is not None:
            if self._sinks_f32 is None:  # after the weights are loaded
                self._sinks_f32 = self.sinks.detach().float().contiguous()
            sinks = self._sinks_f32
        scales = dict(k_scale=layer._k_scale_float, v_scale=layer._v_scale_float)
        t = attn_metadata.num_decode_tokens
        total = attn_metadata.num_actual_tokens
        if plans.decode is not None:
            plans.decode.run(query[:t], caches, out=output[:t], sinks=sinks, **scales)
        if plans.prefill is not None:
            plans.prefill.run(query[t:total], caches, out=output[t:total], sinks=sinks,
                              **scales)
        with _lock:
            _forward_runs[layer.layer_name] += 1
        return output

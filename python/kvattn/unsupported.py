"""FlashInfer's public attention names that kvattn does not provide: each exists here and
raises NotSupportedError on call, naming the function and why (rather than an AttributeError
from `import kvattn as flashinfer`). tests/python/test_signatures.py checks that every public
attention name recorded from FlashInfer's wheel is either working in kvattn or listed here."""

from __future__ import annotations

from typing import Any, Callable, Dict

from ._errors import NotSupportedError

# name -> why kvattn does not provide it
NOT_SUPPORTED: Dict[str, str] = {
    "BatchPrefillWithCausalBidirectionalRangesWrapper":
        "per-request causal/bidirectional range masks are not a kvattn mask (use a "
        "custom_mask with BatchPrefillWithPagedKVCacheWrapper)",
    "BlockSparseAttentionWrapper":
        "block-sparse attention is not in kvattn (a custom_mask expresses the same pattern)",
    "VariableBlockSparseAttentionWrapper":
        "variable block-sparse attention is not in kvattn",
    "cudnn_batch_decode_with_kv_cache": "cuDNN kernels are not kvattn's",
    "launch_sm110_gqa_decode_prepared": "FlashInfer's SM110 GQA decode kernel is not kvattn's",
    "prepare_sm110_gqa_decode": "FlashInfer's SM110 GQA decode kernel is not kvattn's",
    "sm110_gqa_decode": "FlashInfer's SM110 GQA decode kernel is not kvattn's",
    "prepare_balanced_batch_decode_with_kv_cache":
        "FlashInfer's balanced-decode preparation is not kvattn's (plan does the scheduling)",
    "nvfp4_quantize_append_paged_kv_cache": "NVFP4 caches are not in kvattn (fp8 e4m3/e5m2 are)",
    "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping":
        "NVFP4 caches are not in kvattn (fp8 e4m3/e5m2 are)",
    "nvfp4_quantize_append_paged_mla_kv_cache":
        "NVFP4 caches are not in kvattn (fp8 e4m3/e5m2 are)",
    "trtllm_fmha_v2_prefill": "TensorRT-LLM's FMHA kernels are not kvattn's",
    "trtllm_sage_attention_quantize": "SageAttention quantization is not in kvattn",
    "xqa": "TensorRT-LLM's XQA kernel is not kvattn's (use BatchDecodeWithPagedKVCacheWrapper)",
    "xqa_mla": "TensorRT-LLM's XQA kernel is not kvattn's (use BatchMLAPagedAttentionWrapper)",
}


def _function(name: str, why: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotSupportedError(f"{name}: not supported by kvattn: {why}")
    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Not supported by kvattn: {why}. Raises NotSupportedError."
    return refuse


def _class(name: str, why: str) -> type:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise NotSupportedError(f"{name}: not supported by kvattn: {why}")
    return type(name, (), {"__init__": __init__,
                           "__doc__": f"Not supported by kvattn: {why}. Construction raises "
                                      "NotSupportedError."})


STUBS: Dict[str, Any] = {n: (_class if n[0].isupper() else _function)(n, why)
                         for n, why in NOT_SUPPORTED.items()}
globals().update(STUBS)

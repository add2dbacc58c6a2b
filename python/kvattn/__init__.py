"""kvattn: attention kernels for LLM serving, with FlashInfer's Python API.

    import kvattn as flashinfer

works for the attention API (decode, prefill, cascade, page, rope, packbits) over torch tensors
and numpy arrays on the CPU (and CUDA tensors in a CUDA build). Differences from FlashInfer:
``backend=`` also takes "cpu" and "reference"; no argument is silently ignored (what kvattn
cannot honour raises); errors are ``kvattn.Error`` subclasses carrying the C++ message. The LSE
is base 2, as in FlashInfer."""

from . import _kvattn
from ._errors import (AliasingError, Error, InternalError, InvalidArgumentError,
                      InvalidDTypeError, InvalidPageTableError, InvalidScaleError,
                      InvalidShapeError, IoError, NotSupportedError, OutOfBoundsError, ParseError,
                      SizeOverflowError, UnavailableError)
from . import cascade, decode, mla, page, prefill, quantization, rope, selection
from . import attention, pod, unsupported
from .attention import (BatchAttention, BatchAttentionWithAttentionSinkWrapper,
                        BatchDecodeWithAttentionSinkWrapper)
from .cascade import (BatchDecodeWithSharedPrefixPagedKVCacheWrapper,
                      BatchPrefillWithSharedPrefixPagedKVCacheWrapper,
                      MultiLevelCascadeAttentionWrapper, merge_state, merge_state_in_place,
                      merge_states)
from .decode import (BatchDecodeWithPagedKVCacheWrapper,
                     CUDAGraphBatchDecodeWithPagedKVCacheWrapper, fast_decode_plan,
                     single_decode_with_kv_cache)
from .pod import BatchPODWithPagedKVCacheWrapper, PODWithPagedKVCacheWrapper
from .mla import BatchMLAPagedAttentionWrapper
from .page import (append_paged_kv_cache, append_paged_mla_kv_cache, get_batch_indices_positions,
                   get_seq_lens)
from .prefill import (BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper,
                      single_prefill_with_kv_cache, single_prefill_with_kv_cache_return_lse)
from .quantization import packbits, segment_packbits
from .rope import (apply_llama31_rope, apply_llama31_rope_inplace, apply_llama31_rope_pos_ids,
                   apply_llama31_rope_pos_ids_inplace, apply_rope, apply_rope_inplace,
                   apply_rope_pos_ids, apply_rope_pos_ids_inplace, apply_rope_with_cos_sin_cache,
                   apply_rope_with_cos_sin_cache_inplace, mla_rope_quantize_fp8,
                   rope_quantize_fp8, rope_quantize_fp8_append_paged_kv_cache)
from .selection import backend_names, devices, explain, select_backend
from .threads import cpu_threads, host_openmp_runtime, set_cpu_threads

from .unsupported import STUBS as _STUBS

globals().update(_STUBS)  # FlashInfer names kvattn does not provide: NotSupportedError on call

__version__ = _kvattn.__version__

# CPU work on the process's OpenMP team (torch's) when one is loaded: kvattn.threads says why.
set_cpu_threads("auto")

__all__ = [
    "AliasingError", "BatchDecodeWithPagedKVCacheWrapper", "BatchMLAPagedAttentionWrapper", "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper", "Error", "InternalError", "InvalidArgumentError",
    "InvalidDTypeError", "InvalidPageTableError", "InvalidScaleError", "InvalidShapeError",
    "IoError", "MultiLevelCascadeAttentionWrapper", "NotSupportedError", "OutOfBoundsError",
    "ParseError", "SizeOverflowError", "UnavailableError", "append_paged_kv_cache", "append_paged_mla_kv_cache",
    "apply_llama31_rope", "apply_llama31_rope_inplace", "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace", "apply_rope", "apply_rope_inplace",
    "apply_rope_pos_ids", "apply_rope_pos_ids_inplace", "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace", "backend_names", "devices", "explain",
    "get_batch_indices_positions", "get_seq_lens", "merge_state", "merge_state_in_place",
    "merge_states", "packbits", "segment_packbits", "select_backend",
    "single_decode_with_kv_cache", "single_prefill_with_kv_cache",
    "BatchAttention", "BatchAttentionWithAttentionSinkWrapper",
    "BatchDecodeWithAttentionSinkWrapper", "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
    "BatchPrefillWithSharedPrefixPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper", "BatchPODWithPagedKVCacheWrapper",
    "PODWithPagedKVCacheWrapper", "fast_decode_plan", "mla_rope_quantize_fp8",
    "rope_quantize_fp8", "rope_quantize_fp8_append_paged_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
    "cpu_threads", "host_openmp_runtime", "set_cpu_threads",
] + sorted(_STUBS)

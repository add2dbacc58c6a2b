"""transformers integration: the attention implementation "kvattn".

    import kvattn.integrations.transformers  # registers "kvattn"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="kvattn")
    # or: model.set_attn_implementation("kvattn")

Importing this module registers, through transformers' public plug-in points only,
``AttentionInterface.register("kvattn", attention_forward)`` and
``AttentionMaskInterface.register("kvattn", sdpa_mask)``. The mask interface is the one sdpa
uses: a 4-D boolean mask ``[batch, 1, q_len, kv_len]`` (True = attend) when the step needs one
(padding, sliding window, static-cache tail), or ``None`` when the step is plainly causal
(prefill with q_len == kv_len) or has nothing to mask (a decode step without padding).

Every attention call then runs on kvattn's public API: one
``BatchPrefillWithRaggedKVCacheWrapper`` call per layer holding all batch rows, with
``causal=True`` when the mask is None, or the 4-D mask as a per-row ``custom_mask`` otherwise
(left padding in batched ``generate()`` is honoured exactly; a query row with no visible key
gives 0, as sdpa does). The plan is made once per forward pass and reused by all layers (it is
keyed by the mask tensor, which transformers shares between layers). GQA, ``scaling``,
``sliding_window`` and ``softcap`` map to kvattn's num_kv_heads, sm_scale, window_left and
logits_soft_cap. q/k/v in float32, float16 or bfloat16.

``calls`` counts the attention calls served by kvattn (tests read it to prove kvattn ran).

Tested with transformers 5.24.0. Continuous batching (``generate_batch``) is not served: in
5.24 ``ContinuousBatchingManager.switch_to_cb_friendly_attn``
(transformers/generation/continuous_batching/continuous_api.py) raises ValueError for any
implementation other than "paged|eager", "sdpa" or one whose name contains "flash", and
``attn_mask_is_needed`` (continuous_batching/utils.py) hard-codes ["paged|eager", "sdpa"]; a
registered implementation cannot declare itself paged-capable through a public interface.
"""

from __future__ import annotations

import atexit
from typing import Any, Optional, Tuple

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..prefill import BatchPrefillWithRaggedKVCacheWrapper

NAME = "kvattn"

calls: int = 0
"""Attention calls served by kvattn since import (reset it freely)."""

num_threads: int = 1
"""CPU threads per attention call (0: all cores). 1 by default: inside a torch model, torch's
OpenMP workers keep spinning between ops, and a second pool competing with them for the same
cores made generate() 10-30x slower on a 2-core machine (both kvattn's and torch's parts)."""

_workspace = torch.empty(0, dtype=torch.uint8)


class _PlanCache:
    """One planned wrapper, reused while the problem (and the mask object) stays the same:
    all layers of one forward pass share it."""

    def __init__(self) -> None:
        self.key: Optional[Tuple[Any, ...]] = None
        self.mask: Optional[torch.Tensor] = None  # held, so its identity cannot be reused
        self.wrapper: Optional[BatchPrefillWithRaggedKVCacheWrapper] = None

    def get(self, key: Tuple[Any, ...], mask: Optional[torch.Tensor], plan: Any
            ) -> BatchPrefillWithRaggedKVCacheWrapper:
        if self.wrapper is None or key != self.key or mask is not self.mask:
            wrapper = BatchPrefillWithRaggedKVCacheWrapper(_workspace, "NHD")
            plan(wrapper)
            self.key, self.mask, self.wrapper = key, mask, wrapper
        return self.wrapper


_cache = _PlanCache()
# Drop the held plan before interpreter teardown (nanobind reports objects alive at exit).
atexit.register(lambda: _cache.__init__())


def _bool_mask(attention_mask: torch.Tensor, batch: int, q_len: int, kv_len: int
               ) -> torch.Tensor:
    """The 4-D mask as bool [batch, q_len, kv_len] (True = attend); additive float masks
    (0 / large negative) are accepted too. A per-head mask is refused (not produced by
    transformers' mask interfaces for decoder models)."""
    mask = attention_mask
    if mask.dtype != torch.bool:
        mask = mask == 0
    if mask.shape[1] != 1:
        raise ValueError(f"kvattn: a per-head attention mask {tuple(mask.shape)} is not supported")
    mask = mask[:, 0, :, -kv_len:] if mask.shape[-1] != kv_len else mask[:, 0]
    return mask.expand(batch, q_len, kv_len)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                      scaling: Optional[float] = None, dropout: float = 0.0,
                      **kwargs: Any) -> Tuple[torch.Tensor, None]:
    """transformers attention function: query [B, H, S, D], key/value [B, H_kv, K, D] ->
    (output [B, S, H, D], None)."""
    global calls
    if dropout:
        raise ValueError("kvattn: attention dropout is not supported (inference only)")
    if kwargs.get("position_bias") is not None:
        raise ValueError("kvattn: position_bias (additive attention bias) is not supported")
    if kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:
        raise ValueError("kvattn: attention sinks are not supported")
    batch, heads, q_len, head_dim = query.shape
    kv_heads, kv_len, head_dim_vo = key.shape[1], key.shape[2], value.shape[-1]
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else bool(is_causal)
    sliding_window = kwargs.get("sliding_window")
    softcap = kwargs.get("softcap")

    mask = None
    causal = False
    window_left = -1
    if attention_mask is not None:
        mask = _bool_mask(attention_mask, batch, q_len, kv_len)
    elif is_causal and q_len > 1:
        # sdpa's is_causal is upper-left aligned; with q_len < kv_len (an empty static cache
        # at prefill) only the first q_len keys are real, as sdpa's own integration crops.
        if kv_len > q_len:
            key, value, kv_len = key[:, :, :q_len], value[:, :, :q_len], q_len
        causal = True
    if attention_mask is None and sliding_window is not None and is_causal:
        window_left = int(sliding_window) - 1

    q = query.transpose(1, 2).reshape(batch * q_len, heads, head_dim)
    k = key.transpose(1, 2).reshape(batch * kv_len, kv_heads, head_dim)
    v = value.transpose(1, 2).reshape(batch * kv_len, kv_heads, head_dim_vo)

    plan_key = (batch, q_len, kv_len, heads, kv_heads, head_dim, head_dim_vo, query.dtype,
                key.dtype, causal, window_left, softcap, scaling, num_threads)

    def plan(wrapper: BatchPrefillWithRaggedKVCacheWrapper) -> None:
        qo_indptr = torch.arange(batch + 1, dtype=torch.int32) * q_len
        kv_indptr = torch.arange(batch + 1, dtype=torch.int32) * kv_len
        wrapper.plan(qo_indptr, kv_indptr, heads, kv_heads, head_dim, head_dim_vo=head_dim_vo,
                     custom_mask=None if mask is None else mask.reshape(-1).cpu().contiguous(),
                     causal=causal, window_left=window_left,
                     logits_soft_cap=None if not softcap else float(softcap),
                     sm_scale=None if scaling is None else float(scaling),
                     q_data_type=query.dtype, kv_data_type=key.dtype, o_data_type=query.dtype,
                     num_threads=num_threads)

    wrapper = _cache.get(plan_key, attention_mask, plan)
    out = wrapper.run(q, k, v)
    calls += 1
    return out.reshape(batch, q_len, heads, head_dim_vo), None


AttentionInterface.register(NAME, attention_forward)
AttentionMaskInterface.register(NAME, sdpa_mask)

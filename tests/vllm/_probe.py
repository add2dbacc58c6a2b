"""Functions run inside vLLM's worker (LLM.apply_model; pickled by reference: conftest puts this
folder on the PYTHONPATH of vLLM's processes): count calls of vLLM's own CPU attention ops, and report which impl
class serves each attention layer and what kvattn's plugin counted."""

from __future__ import annotations

# vLLM's CPU attention backend calls these (vllm/v1/attention/backends/cpu_attn.py), always
# through the module attribute (`ops.<name>`), so replacing the attribute counts every call.
CPU_ATTN_OPS = ("cpu_attention_with_kv_cache", "cpu_attn_reshape_and_cache",
                "cpu_attn_get_scheduler_metadata")


def install(model):
    """Wraps vLLM's CPU attention ops with call counters (once per process) and zeroes the
    counters and kvattn's."""
    import vllm._custom_ops as ops
    counts = getattr(ops, "_kvattn_test_counts", None)
    if counts is None:
        counts = {}
        for name in CPU_ATTN_OPS:
            original = getattr(ops, name)

            def counted(*args, _original=original, _name=name, **kwargs):
                counts[_name] = counts.get(_name, 0) + 1
                return _original(*args, **kwargs)

            setattr(ops, name, counted)
        ops._kvattn_test_counts = counts
    counts.clear()
    from kvattn.integrations import vllm as plugin
    plugin.reset_stats()
    return True


def read(model):
    """{"impls": {layer name: impl class}, "kvattn": kvattn's stats, "cpu_ops": {op: calls},
    "custom_path": what vLLM's CUSTOM backend is registered to in this process}."""
    import vllm._custom_ops as ops
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from kvattn.integrations import vllm as plugin
    impls = {m.layer_name: f"{type(m.impl).__module__}.{type(m.impl).__qualname__}"
             for m in model.modules() if isinstance(m, Attention)}
    custom = AttentionBackendEnum.CUSTOM
    return {"impls": impls, "kvattn": plugin.stats(),
            "cpu_ops": dict(getattr(ops, "_kvattn_test_counts", {})),
            "custom_path": custom.get_path() if custom.is_overridden() else None}

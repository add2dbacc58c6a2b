"""BatchMLAPagedAttentionWrapper and append_paged_mla_kv_cache against the numpy reference
(MLA: s = (q_nope·ckv + q_pe·kpe)·sm_scale, o = softmax·ckv)."""

import math

import numpy as np
import pytest
import torch

import kvattn
from conftest import rand, workspace
from reference import check_close, f64

LOG2E = 1 / math.log(2)


def mla_reference(q_nope, q_pe, ckv, kpe, sm_scale, causal, k_scale=1.0):
    qn, qp = f64(q_nope), f64(q_pe)
    c, p = f64(ckv) * k_scale, f64(kpe) * k_scale
    m, n = qn.shape[0], c.shape[0]
    s = (np.einsum("mhd,nd->mhn", qn, c) + np.einsum("mhd,nd->mhn", qp, p)) * sm_scale
    if causal:
        vis = np.arange(n)[None, :] <= np.arange(m)[:, None] + n - m
        s = np.where(vis[:, None, :], s, -np.inf)
    mx = s.max(axis=2, keepdims=True, initial=-np.inf)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    e = np.exp(s - mx)
    den = e.sum(axis=2, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        o = np.where(den > 0, np.einsum("mhn,nd->mhd", e, c) / np.where(den > 0, den, 1), 0.0)
        lse = np.where(den[..., 0] > 0, mx[..., 0] + np.log(np.where(den[..., 0] > 0,
                                                                       den[..., 0], 1)), -np.inf)
    return o, lse


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("qo_lens,causal", [([1, 1, 1], False), ([1, 4, 3], True)])
def test_mla_paged(kv_dtype, qo_lens, causal):
    heads, d_ckv, d_kpe, page = 16, 512, 64, 16
    kv_lens = [7, 40, 33]
    pages = [(n + page - 1) // page for n in kv_lens]
    total = sum(pages) + 2
    kv_indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32)
    kv_indices = torch.randperm(total, dtype=torch.int32)[: sum(pages)]
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32)
    ckv = rand((total, page, d_ckv), kv_dtype)
    kpe = rand((total, page, d_kpe), kv_dtype)
    q_nope = rand((sum(qo_lens), heads, d_ckv), torch.bfloat16)
    q_pe = rand((sum(qo_lens), heads, d_kpe), torch.bfloat16)
    sm_scale = 1 / math.sqrt(192)
    k_scale = 0.05 if kv_dtype != torch.bfloat16 else None
    w = kvattn.BatchMLAPagedAttentionWrapper(workspace())
    w.plan(qo_indptr, kv_indptr, kv_indices, torch.tensor(kv_lens, dtype=torch.int32), heads,
           d_ckv, d_kpe, page, causal, sm_scale, torch.bfloat16, kv_dtype)
    out, lse = w.run(q_nope, q_pe, ckv, kpe, return_lse=True, ckv_scale=k_scale)
    assert out.shape == (sum(qo_lens), heads, d_ckv) and out.dtype == torch.bfloat16
    for b in range(3):
        ids = kv_indices[kv_indptr[b]:kv_indptr[b + 1]]
        c = ckv[ids].reshape(-1, d_ckv)[:kv_lens[b]]
        p = kpe[ids].reshape(-1, d_kpe)[:kv_lens[b]]
        r = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        o, l = mla_reference(q_nope[r], q_pe[r], c, p, sm_scale, causal, k_scale or 1.0)
        check_close(out[r], o, torch.bfloat16, inputs_eps=2.0**-8)
        check_close(lse[r], l * LOG2E, torch.float32, "lse", inputs_eps=2.0**-10)


def test_mla_needs_sm_scale_and_append():
    w = kvattn.BatchMLAPagedAttentionWrapper(workspace())
    with pytest.raises(kvattn.InvalidArgumentError):
        w.plan(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32),
               torch.tensor([0], dtype=torch.int32), torch.tensor([3], dtype=torch.int32), 16,
               512, 64, 4, False, None)
    ckv = torch.zeros(2, 4, 512, dtype=torch.bfloat16)
    kpe = torch.zeros(2, 4, 64, dtype=torch.bfloat16)
    a_ckv, a_kpe = rand((3, 512), torch.bfloat16), rand((3, 64), torch.bfloat16)
    kvattn.append_paged_mla_kv_cache(a_ckv, a_kpe, torch.zeros(3, dtype=torch.int32),
                                     torch.tensor([0, 1, 4], dtype=torch.int32), ckv, kpe,
                                     torch.tensor([1, 0], dtype=torch.int32),
                                     torch.tensor([0, 2], dtype=torch.int32),
                                     torch.tensor([1], dtype=torch.int32))
    assert torch.equal(ckv[1, 0], a_ckv[0]) and torch.equal(ckv[1, 1], a_ckv[1])
    assert torch.equal(ckv[0, 0], a_ckv[2]) and torch.equal(kpe[0, 0], a_kpe[2])


@pytest.mark.parametrize("d_kpe", [64, 0])
def test_mla_plan_takes_batch_from_qo_indptr(d_kpe):
    # FlashInfer: the batch size is qo_indptr's; kv_indptr and kv_len_arr sized for a larger
    # batch (CUDA-graph buffers) have their extra entries ignored. head_dim_kpe 0: no pe term.
    heads, d_ckv, page = 16, 64, 4
    kv_lens = [5, 9]
    kv_indptr = torch.tensor([0, 2, 5, 9, 9, 9], dtype=torch.int32)  # 5 slots, 2 used
    kv_len_arr = torch.tensor(kv_lens + [16, 0, 0], dtype=torch.int32)
    kv_indices = torch.tensor([3, 0, 6, 1, 4, 2, 5, 7, 8], dtype=torch.int32)
    qo_indptr = torch.tensor([0, 1, 3], dtype=torch.int32)
    ckv = rand((9, page, d_ckv), torch.bfloat16)
    kpe = rand((9, page, d_kpe), torch.bfloat16)
    q_nope = rand((3, heads, d_ckv), torch.bfloat16)
    q_pe = rand((3, heads, d_kpe), torch.bfloat16)
    sm_scale = 0.125
    w = kvattn.BatchMLAPagedAttentionWrapper(workspace())
    w.plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, heads, d_ckv, d_kpe, page, True,
           sm_scale, torch.bfloat16, torch.bfloat16)
    out = w.run(q_nope, q_pe, ckv, kpe)
    for b in range(2):
        ids = kv_indices[kv_indptr[b]:kv_indptr[b + 1]]
        c = ckv[ids].reshape(-1, d_ckv)[:kv_lens[b]]
        p = kpe[ids].reshape(len(ids) * page, d_kpe)[:kv_lens[b]]
        r = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        o, _ = mla_reference(q_nope[r], q_pe[r], c, p, sm_scale, True)
        check_close(out[r], o, torch.bfloat16, inputs_eps=2.0**-8)
    # Too few kv_indptr entries for qo_indptr's batch is still an error.
    with pytest.raises(kvattn.InvalidArgumentError, match="kv_indptr"):
        w.plan(qo_indptr, kv_indptr[:2], kv_indices, kv_len_arr, heads, d_ckv, d_kpe, page,
               True, sm_scale, torch.bfloat16, torch.bfloat16)

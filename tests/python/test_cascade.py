"""merge_state(s) in base 2 against an fp64 merge, and MultiLevelCascadeAttentionWrapper (a
shared prefix level + per-request levels) against attention over the concatenated keys."""

import math

import numpy as np
import pytest
import torch

import kvattn
from conftest import paged_batch, rand, workspace
from reference import attention, check_close, f64


def merge_ref(vs, ss):
    """fp64 merge of states (v [.., H, D], s base 2 [.., H]) listed in vs / ss."""
    s = np.stack([f64(x) for x in ss])
    m = s.max(axis=0)
    mm = np.where(np.isfinite(m), m, 0.0)
    w = np.exp2(s - mm)
    tot = w.sum(axis=0)
    v = sum(w[i][..., None] * f64(vs[i]) for i in range(len(vs)))
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(tot[..., None] > 0, v / np.where(tot > 0, tot, 1)[..., None], 0.0)
        lse = np.where(tot > 0, mm + np.log2(np.where(tot > 0, tot, 1)), -np.inf)
    return out, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_merge_state(dtype):
    v_a, v_b = rand((7, 4, 64), dtype), rand((7, 4, 64), dtype)
    s_a, s_b = torch.randn(7, 4) * 3, torch.randn(7, 4) * 3
    s_a[0, 0] = -math.inf  # identity state
    v, s = kvattn.merge_state(v_a, s_a, v_b, s_b)
    ro, rl = merge_ref([v_a, v_b], [s_a, s_b])
    check_close(v, ro, dtype)
    check_close(s, rl, torch.float32, "s")
    assert torch.equal(v[0, 0], v_b[0, 0])


def test_merge_state_in_place_with_mask():
    v, v_o = rand((6, 2, 32), torch.float16), rand((6, 2, 32), torch.float16)
    s, s_o = torch.randn(6, 2), torch.randn(6, 2)
    mask = torch.tensor([True, False, True, True, False, True])
    v0, s0 = v.clone(), s.clone()
    data_ptr = v.data_ptr()
    kvattn.merge_state_in_place(v, s, v_o, s_o, mask=mask)
    assert v.data_ptr() == data_ptr
    ro, rl = merge_ref([v0, v_o], [s0, s_o])
    keep = ~mask
    assert torch.equal(v[keep], v0[keep]) and torch.equal(s[keep], s0[keep])
    check_close(v[mask], ro[mask.numpy()], torch.float16)
    check_close(s[mask], rl[mask.numpy()], torch.float32, "s")


def test_merge_states():
    v = rand((5, 3, 4, 64), torch.bfloat16)
    s = torch.randn(5, 3, 4) * 2
    vo, so = kvattn.merge_states(v, s)
    ro, rl = merge_ref([v[:, i] for i in range(3)], [s[:, i] for i in range(3)])
    check_close(vo, ro, torch.bfloat16)
    check_close(so, rl, torch.float32, "s")


def test_multi_level_cascade_equals_flat_attention():
    # level 0: one shared prefix of 2 pages for all 3 requests; level 1: each request's pages.
    page, h_kv, h_qo, d = 4, 2, 4, 64
    shared = paged_batch([8], page, h_kv, d, torch.float16, extra_pages=0)
    own_lens = [3, 9, 0]
    own = paged_batch(own_lens, page, h_kv, d, torch.float16, extra_pages=0)
    # one cache holding both: shared pages first, then the requests' pages
    cache = torch.cat([shared.cache, own.cache])
    qo_lens = [2, 3, 1]
    qo = torch.tensor([0, 2, 5, 6], dtype=torch.int32)
    q = rand((6, h_qo, d), torch.float16)
    w = kvattn.MultiLevelCascadeAttentionWrapper(2, workspace())
    off = shared.cache.shape[0]
    w.plan([torch.tensor([0, 6], dtype=torch.int32), qo],
           [shared.indptr, own.indptr], [shared.indices, own.indices + off],
           [shared.last_page_len, own.last_page_len], h_qo, h_kv, d, page, causal=True)
    out = w.run(q, cache)
    for b in range(3):
        k = np.concatenate([shared.request_kv(0, 0), own.request_kv(b, 0)])
        v = np.concatenate([shared.request_kv(0, 1), own.request_kv(b, 1)])
        r = slice(int(qo[b]), int(qo[b + 1]))
        # causal within the request's own level only: the prefix is visible to every query
        m, n_own = qo_lens[b], own_lens[b]
        i = np.arange(m)[:, None] + n_own - m
        mask = np.concatenate([np.ones((m, 8), bool), np.arange(n_own)[None, :] <= i], axis=1)
        o, _ = attention(f64(q[r]), k, v, mask=mask)
        check_close(out[r], o, torch.float16)

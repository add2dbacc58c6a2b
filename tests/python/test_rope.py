"""The RoPE functions against the numpy reference: ragged (indptr + offsets) and pos_ids forms,
in place and not, interleaved, partial rotary_dim, Llama 3.1 scaling, cos/sin cache."""

import numpy as np
import pytest
import torch

import kvattn
from conftest import rand
from reference import check_close, f64, rope


def positions(indptr, offsets):
    return np.concatenate([o + np.arange(indptr[i + 1] - indptr[i])
                           for i, o in enumerate(offsets)])


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 32])
def test_apply_rope_forms(interleave, rotary_dim):
    q, k = rand((10, 4, 64), torch.float32), rand((10, 2, 64), torch.float32)
    indptr = torch.tensor([0, 3, 10], dtype=torch.int32)
    offsets = torch.tensor([5, 100], dtype=torch.int32)
    pos = positions(indptr.numpy(), offsets.numpy())
    rq = rope(f64(q), pos, 1e4, 1.0, interleave, rotary_dim)
    rk = rope(f64(k), pos, 1e4, 1.0, interleave, rotary_dim)
    qo, ko = kvattn.apply_rope(q, k, indptr, offsets, rotary_dim, interleave)
    check_close(qo, rq, torch.float32)
    check_close(ko, rk, torch.float32)
    qo2, ko2 = kvattn.apply_rope_pos_ids(q, k, torch.from_numpy(pos.astype(np.int32)),
                                         rotary_dim, interleave)
    assert torch.equal(qo, qo2) and torch.equal(ko, ko2)
    q2, k2 = q.clone(), k.clone()
    kvattn.apply_rope_inplace(q2, k2, indptr, offsets, rotary_dim, interleave)
    assert torch.equal(q2, qo) and torch.equal(k2, ko)
    kvattn.apply_rope_pos_ids_inplace(q, k, torch.from_numpy(pos.astype(np.int32)), rotary_dim,
                                      interleave)
    assert torch.equal(q, qo) and torch.equal(k, ko)


def test_llama31_rope():
    q, k = rand((6, 2, 128), torch.float32), rand((6, 1, 128), torch.float32)
    pos = np.array([0, 1, 1000, 9000, 20000, 131000], dtype=np.int32)
    qo, ko = kvattn.apply_llama31_rope_pos_ids(q, k, torch.from_numpy(pos))
    check_close(qo, rope(f64(q), pos, 5e5, 8.0, llama31=(1.0, 4.0, 8192.0)), torch.float32,
                inputs_eps=2.0**-16)
    check_close(ko, rope(f64(k), pos, 5e5, 8.0, llama31=(1.0, 4.0, 8192.0)), torch.float32,
                inputs_eps=2.0**-16)
    indptr = torch.tensor([0, 6], dtype=torch.int32)
    offsets = torch.tensor([0], dtype=torch.int32)
    qa, ka = kvattn.apply_llama31_rope(q, k, indptr, offsets)
    qb, kb = kvattn.apply_llama31_rope_pos_ids(q, k, torch.arange(6, dtype=torch.int32))
    assert torch.equal(qa, qb) and torch.equal(ka, kb)
    kvattn.apply_llama31_rope_inplace(q, k, indptr, offsets)
    assert torch.equal(q, qa)
    q3 = qa.clone()
    kvattn.apply_llama31_rope_pos_ids_inplace(q3, kb.clone(), torch.zeros(6, dtype=torch.int32))
    assert torch.allclose(q3, qa)  # position 0 is the identity


@pytest.mark.parametrize("is_neox", [True, False])
def test_cos_sin_cache(is_neox):
    head, rot = 64, 32
    max_pos = 50
    t = np.arange(rot // 2)
    ang = np.arange(max_pos)[:, None] * (1e4 ** (-2.0 * t / rot))[None, :]
    cache = torch.from_numpy(np.concatenate([np.cos(ang), np.sin(ang)], axis=1)).float()
    q = rand((5, 3 * head), torch.float32)
    k = rand((5, 1 * head), torch.float32)
    pos = torch.tensor([0, 4, 9, 49, 1], dtype=torch.int64)
    qo, ko = kvattn.apply_rope_with_cos_sin_cache(pos, q, k, head, cache, is_neox)
    ref = rope(f64(q).reshape(5, 3, head), pos.numpy(), 1e4, 1.0, not is_neox, rot)
    check_close(qo.reshape(5, 3, head), ref, torch.float32, inputs_eps=2.0**-20)
    kvattn.apply_rope_with_cos_sin_cache_inplace(pos, q, k, head, cache, is_neox)
    assert torch.equal(q, qo) and torch.equal(k, ko)
    with pytest.raises(kvattn.OutOfBoundsError):
        kvattn.apply_rope_with_cos_sin_cache(torch.tensor([0, 0, 0, 0, 50]), q, k, head, cache)


def test_inplace_rope_on_packed_qkv_views():
    # vLLM / SGLang: q, k, v = qkv.split(...) of one packed [nnz, (Hq + 2 Hk) * D] tensor; the
    # views interleave row by row but share no element, so in-place RoPE on them is allowed.
    nnz, hq, hk, d = 9, 4, 2, 64
    qkv = rand((nnz, (hq + 2 * hk) * d), torch.bfloat16)
    before = qkv.clone()
    q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    pos = torch.arange(nnz, dtype=torch.int32) * 7
    kvattn.apply_rope_pos_ids_inplace(q.view(nnz, hq, d), k.view(nnz, hk, d), pos)
    p = pos.numpy()
    check_close(q.reshape(nnz, hq, d), rope(f64(before[:, :hq * d].reshape(nnz, hq, d)), p),
                torch.bfloat16)
    check_close(k.reshape(nnz, hk, d),
                rope(f64(before[:, hq * d:(hq + hk) * d].reshape(nnz, hk, d)), p), torch.bfloat16)
    assert torch.equal(v, before[:, (hq + hk) * d:])  # v untouched
    # Interleaved strided slices (even and odd heads of one tensor) share no element either.
    x = rand((nnz, 2 * hk, d), torch.float32)
    xb = x.clone()
    kvattn.apply_rope_pos_ids_inplace(x[:, 0::2], x[:, 1::2], pos)
    check_close(x[:, 0::2], rope(f64(xb[:, 0::2]), p), torch.float32)
    check_close(x[:, 1::2], rope(f64(xb[:, 1::2]), p), torch.float32)
    # Views that share elements are refused, and nothing is written.
    y = rand((nnz, 4, d), torch.float32)
    y0 = y.clone()
    with pytest.raises(kvattn.AliasingError, match="overlaps"):
        kvattn.apply_rope_pos_ids_inplace(y[:, 0:3], y[:, 2:4], pos)  # head 2 in both
    assert torch.equal(y, y0)

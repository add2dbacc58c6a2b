"""append_paged_kv_cache (converting and quantizing), get_seq_lens,
get_batch_indices_positions."""

import numpy as np
import pytest
import torch

import kvattn
from conftest import paged_batch, rand


def test_seq_lens_and_batch_indices_positions():
    indptr = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    last = torch.tensor([3, 0, 1], dtype=torch.int32)
    assert kvattn.get_seq_lens(indptr, last, 4).tolist() == [7, 0, 9]
    append_indptr = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    b, p = kvattn.get_batch_indices_positions(append_indptr, torch.tensor([7, 0, 9]), 5)
    assert b.tolist() == [0, 0, 2, 2, 2] and p.tolist() == [5, 6, 6, 7, 8]
    assert b.dtype == torch.int32


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_append_paged_kv_cache(cache_dtype, kv_layout):
    batch = paged_batch([5, 9], 4, 2, 64, cache_dtype, kv_layout)
    before = batch.cache.clone()
    append_indptr = torch.tensor([0, 2, 5], dtype=torch.int32)
    seq_lens = kvattn.get_seq_lens(batch.indptr, batch.last_page_len, 4)
    b, p = kvattn.get_batch_indices_positions(append_indptr, seq_lens, 5)
    k = rand((5, 2, 64), torch.bfloat16, scale=100.0)  # large, within e4m3 and e5m2 range
    v = rand((5, 2, 64), torch.bfloat16)
    kvattn.append_paged_kv_cache(k, v, b, p, batch.cache, batch.indices, batch.indptr,
                                 batch.last_page_len, kv_layout)
    written = torch.zeros(batch.cache.shape[0], 4, dtype=torch.bool)
    for i in range(5):
        req, pos = int(b[i]), int(p[i])
        page = int(batch.indices[int(batch.indptr[req]) + pos // 4])
        slot = pos % 4
        written[page, slot] = True
        for which, src in ((0, k), (1, v)):
            got = batch.cache[page, which, slot] if kv_layout == "NHD" else \
                batch.cache[page, which, :, slot]
            want = src[i].float().to(cache_dtype)  # RNE, saturating for e4m3 as torch casts
            assert torch.equal(got.view(torch.uint8) if cache_dtype.itemsize == 1 else got,
                               want.view(torch.uint8) if cache_dtype.itemsize == 1 else want)
    # nothing else was touched
    for page in range(batch.cache.shape[0]):
        for slot in range(4):
            if written[page, slot]:
                continue
            a = before[page, :, slot] if kv_layout == "NHD" else before[page, :, :, slot]
            c = batch.cache[page, :, slot] if kv_layout == "NHD" else batch.cache[page, :, :, slot]
            assert torch.equal(a.view(torch.uint8) if cache_dtype.itemsize == 1 else a,
                               c.view(torch.uint8) if cache_dtype.itemsize == 1 else c)


def test_append_with_scale_quantizes_by_division():
    batch = paged_batch([4], 4, 1, 64, torch.float8_e4m3fn)
    k = rand((1, 1, 64), torch.float32, scale=1000.0)
    v = rand((1, 1, 64), torch.float32)
    b = torch.zeros(1, dtype=torch.int32)
    p = torch.tensor([3], dtype=torch.int32)
    kvattn.append_paged_kv_cache(k, v, b, p, batch.cache, batch.indices, batch.indptr,
                                 batch.last_page_len, k_scale=4.0)
    page = int(batch.indices[0])
    want = (k[0] / 4.0).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(batch.cache[page, 0, 3].view(torch.uint8), want.view(torch.uint8))


def test_batch_indices_positions_pad_with_minus_one():
    # FlashInfer's convention: the entries past append_indptr[-1] get batch index -1.
    append_indptr = torch.tensor([0, 1, 3], dtype=torch.int32)
    b, p = kvattn.get_batch_indices_positions(append_indptr, torch.tensor([4, 6]), 7)
    assert b.tolist() == [0, 1, 1, -1, -1, -1, -1]
    assert p.tolist() == [3, 4, 5, 0, 0, 0, 0]
    # Preallocated outputs (as engines pass them, sized for the largest step) are overwritten.
    bi = torch.full((6,), 123, dtype=torch.int32)
    pi = torch.full((6,), 123, dtype=torch.int32)
    kvattn.get_batch_indices_positions(append_indptr, torch.tensor([4, 6]), 6, bi, pi)
    assert bi.tolist() == [0, 1, 1, -1, -1, -1] and pi.tolist()[:3] == [3, 4, 5]


def _canary_cache(batch):
    """The cache refilled with a byte pattern no append writes by accident."""
    raw = batch.cache.view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8))
    return batch.cache.clone()


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_padded_append_rows_write_nothing(cache_dtype, kv_layout):
    page_size = 4
    batch = paged_batch([5, 9, 3], page_size, 2, 32, cache_dtype, kv_layout)
    before = _canary_cache(batch)
    seq_lens = kvattn.get_seq_lens(batch.indptr, batch.last_page_len, page_size)
    append_indptr = torch.tensor([0, 2, 5, 6], dtype=torch.int32)
    nnz_max = 16  # buffers sized for the largest step: 10 padded rows
    b, p = kvattn.get_batch_indices_positions(append_indptr, seq_lens, nnz_max)
    assert (b[6:] == -1).all()
    k = rand((nnz_max, 2, 32), torch.bfloat16)
    v = rand((nnz_max, 2, 32), torch.bfloat16)
    kvattn.append_paged_kv_cache(k, v, b, p, batch.cache, batch.indices, batch.indptr,
                                 batch.last_page_len, kv_layout)
    # The expected cache: the canary, with exactly the 6 real rows written (as torch casts).
    want = before.clone()
    for i in range(6):
        req, pos = int(b[i]), int(p[i])
        page = int(batch.indices[int(batch.indptr[req]) + pos // page_size])
        slot = pos % page_size
        for which, src in ((0, k), (1, v)):
            val = src[i].float().to(cache_dtype)
            if kv_layout == "NHD":
                want[page, which, slot] = val
            else:
                want[page, which, :, slot] = val
    assert torch.equal(batch.cache.view(torch.uint8), want.view(torch.uint8))


def test_padded_rows_with_garbage_positions_and_mla():
    batch = paged_batch([3, 6], 4, 1, 16, torch.float32)
    before = _canary_cache(batch)
    b = torch.tensor([-1, 1, -1], dtype=torch.int32)
    p = torch.tensor([-55, 2, 1 << 30], dtype=torch.int32)  # a padded row's position is not read
    k = rand((3, 1, 16), torch.float32)
    kvattn.append_paged_kv_cache(k, k, b, p, batch.cache, batch.indices, batch.indptr,
                                 batch.last_page_len)
    page = int(batch.indices[int(batch.indptr[1])])
    want = before.clone()
    want[page, :, 2] = k[1]
    assert torch.equal(batch.cache.view(torch.uint8), want.view(torch.uint8))
    # Any other negative batch index is an error naming the argument, the value and the rule.
    with pytest.raises(kvattn.OutOfBoundsError, match=r"batch_indices\[0\] = -2.*or -1"):
        kvattn.append_paged_kv_cache(k, k, torch.tensor([-2, 1, -1], dtype=torch.int32), p,
                                     batch.cache, batch.indices, batch.indptr,
                                     batch.last_page_len)
    assert torch.equal(batch.cache.view(torch.uint8), want.view(torch.uint8))
    # The MLA append shares the rule.
    ckv = torch.randint(0, 256, (4, 4, 64), dtype=torch.uint8).view(torch.bfloat16).clone()
    kpe = torch.randint(0, 256, (4, 4, 16), dtype=torch.uint8).view(torch.bfloat16).clone()
    ckv0, kpe0 = ckv.clone(), kpe.clone()
    indptr = torch.tensor([0, 1, 3], dtype=torch.int32)
    indices = torch.tensor([2, 0, 3], dtype=torch.int32)
    last = torch.tensor([2, 4], dtype=torch.int32)
    a_ckv = rand((3, 32), torch.bfloat16)
    a_kpe = rand((3, 8), torch.bfloat16)
    kvattn.append_paged_mla_kv_cache(a_ckv, a_kpe, torch.tensor([-1, 1, -1], dtype=torch.int32),
                                     torch.tensor([0, 7, 0], dtype=torch.int32), ckv, kpe,
                                     indices, indptr, last)
    ckv0[3, 3], kpe0[3, 3] = a_ckv[1], a_kpe[1]
    assert torch.equal(ckv.view(torch.uint8), ckv0.view(torch.uint8))
    assert torch.equal(kpe.view(torch.uint8), kpe0.view(torch.uint8))

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

"""Shared builders: random paged / ragged batches in every cache form the API accepts."""

from __future__ import annotations

import dataclasses
from typing import List

import numpy as np
import pytest
import torch

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
          "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
    np.random.seed(1234)


def rand(shape, dtype, scale=1.0):
    """Random values representable in `dtype` (fp8 via a float32 draw, saturating cast)."""
    x = torch.randn(*shape) * scale
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return x.clamp(-200, 200).to(dtype)
    return x.to(dtype)


@dataclasses.dataclass
class PagedBatch:
    kv_lens: List[int]
    page_size: int
    num_kv_heads: int
    head_dim: int
    kv_layout: str
    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor
    cache: torch.Tensor            # [P, 2, page_size, H, D] (NHD) or [P, 2, H, page_size, D]

    def nhd(self, which: int) -> np.ndarray:
        """K (0) or V (1) pages as fp64 [P, page_size, H, D]."""
        c = self.cache[:, which].to(torch.float64)
        if self.kv_layout == "HND":
            c = c.transpose(1, 2)
        return c.numpy()

    def request_kv(self, b: int, which: int) -> np.ndarray:
        from reference import paged_kv
        ids = self.indices[self.indptr[b]:self.indptr[b + 1]].numpy()
        return paged_kv(self.nhd(which), ids, self.kv_lens[b], self.page_size)

    def cache_form(self, form: str):
        """The cache as FlashInfer accepts it: one tensor, or a (k, v) tuple of views."""
        return self.cache if form == "single" else (self.cache[:, 0], self.cache[:, 1])


def paged_batch(kv_lens, page_size, num_kv_heads, head_dim, kv_dtype, kv_layout="NHD",
                extra_pages=3) -> PagedBatch:
    pages = [(n + page_size - 1) // page_size for n in kv_lens]
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    total = int(indptr[-1]) + extra_pages
    indices = np.random.permutation(total)[: indptr[-1]].astype(np.int32)
    last = np.array([n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, pages)],
                    dtype=np.int32)
    shape = ((total, 2, page_size, num_kv_heads, head_dim) if kv_layout == "NHD"
             else (total, 2, num_kv_heads, page_size, head_dim))
    cache = rand(shape, kv_dtype)
    return PagedBatch(list(kv_lens), page_size, num_kv_heads, head_dim, kv_layout,
                      torch.from_numpy(indptr), torch.from_numpy(indices),
                      torch.from_numpy(last), cache)


def workspace():
    return torch.empty(32 << 20, dtype=torch.uint8)

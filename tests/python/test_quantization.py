"""packbits / segment_packbits against numpy.packbits."""

import numpy as np
import torch

import kvattn


def test_packbits_orders():
    x = torch.rand(37) > 0.5
    for order in ("big", "little"):
        assert kvattn.packbits(x, order).numpy().tolist() == \
            np.packbits(x.numpy(), bitorder=order).tolist()


def test_segment_packbits():
    x = torch.rand(30) > 0.5
    indptr = torch.tensor([0, 3, 3, 20, 30], dtype=torch.int32)
    packed, new_indptr = kvattn.segment_packbits(x, indptr, bitorder="little")
    assert new_indptr.tolist() == [0, 1, 1, 4, 6]
    for i in range(4):
        seg = x[int(indptr[i]):int(indptr[i + 1])].numpy()
        got = packed[int(new_indptr[i]):int(new_indptr[i + 1])].numpy()
        assert got.tolist() == np.packbits(seg, bitorder="little").tolist()

"""Bit packing of boolean masks (flashinfer.quantization.packbits / segment_packbits)."""

from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from ._errors import InvalidArgumentError
from ._tensors import numpy_like, to_numpy




def _check_bitorder(bitorder: str) -> str:
    if bitorder not in ("big", "little"):
        raise InvalidArgumentError(f"bitorder = {bitorder!r}: expected big or little")
    return bitorder


def packbits(x: Any, bitorder: str = "big") -> Any:
    """Packs the flattened boolean x into uint8, 8 elements a byte (numpy.packbits)."""
    bits = to_numpy(x).reshape(-1).astype(bool)
    return numpy_like(x, np.packbits(bits, bitorder=_check_bitorder(bitorder)))


def segment_packbits(x: Any, indptr: Any, bitorder: str = "big") -> Tuple[Any, Any]:
    """Packs each segment x[indptr[i]:indptr[i+1]] on its own (each starts at a byte
    boundary). Returns (packed uint8, new indptr int32 in bytes). Masks use bitorder="little"."""
    _check_bitorder(bitorder)
    bits = to_numpy(x).reshape(-1).astype(bool)
    ind = to_numpy(indptr).astype(np.int64)
    if ind.ndim != 1 or len(ind) < 1 or ind[0] != 0 or np.any(np.diff(ind) < 0) or \
            ind[-1] > len(bits):
        raise InvalidArgumentError("indptr: must start at 0, be non-decreasing and end within x")
    lens = (np.diff(ind) + 7) // 8
    new_indptr = np.zeros(len(ind), dtype=np.int32)
    np.cumsum(lens, out=new_indptr[1:])
    parts = [np.packbits(bits[ind[i]:ind[i + 1]], bitorder=bitorder) for i in range(len(ind) - 1)]
    packed = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)
    return numpy_like(x, packed.astype(np.uint8)), numpy_like(indptr, new_indptr)

"""An fp64 numpy reference of kvattn's semantics (DESIGN.md §2), written for the Python tests and
independent of the C++ reference: scores, soft cap, ALiBi, RoPE (llama, non-interleaved),
causal (bottom-right aligned), sliding window, custom mask, LSE (natural log here; the Python API
returns base 2), and the tolerance rule by output precision."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

# Unit roundoff of each output dtype: the tolerance rule scales with it.
EPS = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
# What fp32 accumulation (exp, running sums, dot products over up to a few thousand terms, in
# blocks) adds on top of the output rounding: 32 fp32 ulps of the largest value.
ACC_EPS = 2.0**-18


def f64(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def alibi_slopes(h: int) -> np.ndarray:
    n = 2 ** int(math.floor(math.log2(h)))
    s = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    s += [2.0 ** (-4.0 * (2 * (i - n) + 1) / n) for i in range(n, h)]
    return np.array(s)


def rope(x: np.ndarray, pos: np.ndarray, theta: float = 1e4, scale: float = 1.0,
         interleave: bool = False, rotary_dim: Optional[int] = None,
         llama31: Optional[tuple] = None) -> np.ndarray:
    """x [n, h, d] rotated at positions pos [n]."""
    d = x.shape[-1]
    r = d if rotary_dim is None else rotary_dim
    t = np.arange(r // 2)
    freq = theta ** (-2.0 * t / r)
    p = pos.astype(np.float64)[:, None]
    if llama31 is not None:
        low, high, old = llama31
        wavelen = 2 * math.pi / freq
        smooth = (old / wavelen - low) / (high - low)
        f = np.where(wavelen < old / high, freq,
                     np.where(wavelen > old / low, freq / scale,
                              (1 - smooth) * freq / scale + smooth * freq))
        ang = p * f[None, :]
    else:
        ang = (p / scale) * freq[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.copy()
    if interleave:
        a, b = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2] = a * cos - b * sin
        out[..., 1:r:2] = b * cos + a * sin
    else:
        a, b = x[..., : r // 2], x[..., r // 2: r]
        out[..., : r // 2] = a * cos - b * sin
        out[..., r // 2: r] = b * cos + a * sin
    return out


def attention(q, k, v, *, causal=False, window_left=-1, soft_cap=0.0, sm_scale=None,
              mask=None, pos_encoding="NONE", rope_theta=1e4, rope_scale=1.0, q_scale=1.0,
              k_scale=1.0, v_scale=1.0, sinks=None):
    """One request: q [m, Hq, Dqk], k [n, Hkv, Dqk], v [n, Hkv, Dvo] (fp64 numpy, NHD).
    k_scale / v_scale: a float, or per (token, head) [n, Hkv]. sinks [Hq]: one logit per head
    joining the denominator. Returns (o [m, Hq, Dvo], lse_natural [m, Hq])."""
    ks = np.asarray(k_scale, dtype=np.float64)
    vs = np.asarray(v_scale, dtype=np.float64)
    q = f64(q) * q_scale
    k = f64(k) * (ks[..., None] if ks.ndim else ks)
    v = f64(v) * (vs[..., None] if vs.ndim else vs)
    m, hq, dqk = q.shape
    n, hkv, _ = k.shape
    g = hq // hkv
    scale = 1.0 / math.sqrt(dqk) if sm_scale is None else sm_scale
    offset = n - m
    if pos_encoding == "ROPE_LLAMA":
        q = rope(q, np.arange(m) + offset, rope_theta, rope_scale)
        k = rope(k, np.arange(n), rope_theta, rope_scale)
    o = np.zeros((m, hq, v.shape[2]))
    lse = np.full((m, hq), -np.inf)
    i = np.arange(m)[:, None] + offset
    j = np.arange(n)[None, :]
    visible = np.ones((m, n), dtype=bool)
    if causal:
        visible &= j <= i
    if window_left >= 0:
        visible &= j >= i - window_left
    if mask is not None:
        visible &= np.asarray(mask, dtype=bool).reshape(m, n)
    slopes = alibi_slopes(hq)
    for h in range(hq):
        s = (q[:, h, :] @ k[:, h // g, :].T) * scale
        if soft_cap > 0:
            s = soft_cap * np.tanh(s / soft_cap)
        if pos_encoding == "ALIBI":
            s = s + slopes[h] * (j - i)
        s = np.where(visible, s, -np.inf)
        mx = s.max(axis=1, keepdims=True, initial=-np.inf)
        if sinks is not None:
            mx = np.maximum(mx, float(sinks[h]))
        rows = np.isfinite(mx[:, 0])
        if not rows.any():
            continue
        e = np.exp(s[rows] - mx[rows])
        den = e.sum(axis=1, keepdims=True)
        if sinks is not None:
            den = den + np.exp(float(sinks[h]) - mx[rows])
        o[rows, h, :] = (e @ v[:, h // g, :]) / den
        lse[rows, h] = (mx[rows] + np.log(den))[:, 0]
    return o, lse


def check_close(got, ref: np.ndarray, out_dtype, what: str = "out", inputs_eps: float = 0.0):
    """The tolerance rule by precision: |got - ref| <= 2 * (error of rounding ref to the output
    dtype) + eps(out) * max(1, max|ref|) (+ what the inputs' rounding allows, for a kernel that
    rounds an intermediate to the inputs' precision)."""
    got64 = f64(got)
    ref = np.asarray(ref, dtype=np.float64)
    assert got64.shape == ref.shape, f"{what}: shape {got64.shape} != {ref.shape}"
    finite = np.isfinite(ref)
    rounded = f64(torch.from_numpy(ref).to(out_dtype)) if out_dtype in EPS else ref
    with np.errstate(invalid="ignore"):
        baseline = np.abs(np.where(finite, rounded - ref, 0.0)).max(initial=0.0)
    bound = 2 * baseline + (EPS.get(out_dtype, 2.0**-23) + ACC_EPS + inputs_eps) * max(
        1.0, np.abs(np.where(finite, ref, 0.0)).max(initial=0.0))
    # infinities (lse of a row without keys) must match exactly
    with np.errstate(invalid="ignore"):
        err = np.where(finite, np.abs(got64 - ref), np.where(got64 == ref, 0.0, np.inf))
    err = np.where(np.isnan(err), np.inf, err)
    worst = err.max(initial=0.0)
    assert worst <= bound, f"{what}: max |err| {worst:.3g} > bound {bound:.3g}"


def paged_kv(k_pages_nhd: np.ndarray, indices, length: int, page_size: int) -> np.ndarray:
    """The first `length` tokens of a request's pages [P, page_size, H, D] (NHD) in order."""
    if length == 0:
        return k_pages_nhd[:0].reshape(0, *k_pages_nhd.shape[2:])
    rows = k_pages_nhd[np.asarray(indices)]
    return rows.reshape(-1, *k_pages_nhd.shape[2:])[:length]

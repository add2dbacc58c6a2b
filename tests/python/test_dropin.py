"""The FlashInfer names engines call beyond the core wrappers (issue 20), each against the fp64
numpy reference: fast_decode_plan, use_tensor_cores, the legacy shared-prefix wrappers,
BatchAttention, the attention-sink wrappers, the POD wrappers, the fused RoPE + FP8 quantize
[+ append] functions, and the deprecated forward() honouring its problem parameters."""

import functools
import math

import numpy as np
import pytest
import torch

import kvattn
from conftest import paged_batch, rand, workspace
from reference import attention, check_close, f64, rope

LOG2E = 1 / math.log(2)


def decode_ref(batch, q, **kw):
    outs, lses = [], []
    for b in range(len(batch.kv_lens)):
        o, lse = attention(f64(q[b:b + 1]), batch.request_kv(b, 0), batch.request_kv(b, 1), **kw)
        outs.append(o[0])
        lses.append(lse[0])
    return np.stack(outs), np.stack(lses)


def prefill_ref(batch, q, qo_indptr, **kw):
    outs, lses = [], []
    for b in range(len(batch.kv_lens)):
        r = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        o, lse = attention(f64(q[r]), batch.request_kv(b, 0), batch.request_kv(b, 1), **kw)
        outs.append(o)
        lses.append(lse)
    return np.concatenate(outs), np.concatenate(lses)


# ---- fast_decode_plan, use_tensor_cores ----

def test_fast_decode_plan_is_plan_with_every_keyword_honoured():
    batch = paged_batch([40, 7, 130], 16, 2, 64, torch.bfloat16)
    q = rand((3, 8, 64), torch.bfloat16)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace(), use_tensor_cores=True)
    assert w.use_tensor_cores is True
    assert kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace()).use_tensor_cores is False
    # SGLang binds it in place of plan and calls the bound form every step.
    w.plan = functools.partial(kvattn.fast_decode_plan, w)
    ref = decode_ref(batch, q, sm_scale=0.2, soft_cap=7.0)[0]
    for opts in ({}, {"fixed_split_size": 2}, {"disable_split_kv": True}):
        w.plan(batch.indptr, batch.indices, batch.last_page_len, 8, 2, 64, 16,
               logits_soft_cap=7.0, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
               sm_scale=0.2, non_blocking=True, **opts)
        check_close(w.run(q, batch.cache), ref, torch.bfloat16)
    # global_override_indptr_cpu is the indptr planned with (indptr itself may be stale).
    stale = torch.zeros_like(batch.indptr)
    w.plan(stale, batch.indices, batch.last_page_len, 8, 2, 64, 16, logits_soft_cap=7.0,
           q_data_type=torch.bfloat16, sm_scale=0.2, global_override_indptr_cpu=batch.indptr)
    check_close(w.run(q, batch.cache), ref, torch.bfloat16)
    # data_type fills q_data_type when it is None (fast_decode_plan's default).
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 8, 2, 64, 16,
           data_type=torch.bfloat16)
    check_close(w.run(q, batch.cache), decode_ref(batch, q)[0], torch.bfloat16)
    # Several query tokens per request are FlashInfer's q_len_per_req.
    q2 = rand((6, 8, 64), torch.bfloat16)
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 8, 2, 64, 16,
           q_data_type=torch.bfloat16, q_len_per_req=2)
    out = w.run(q2, batch.cache)
    for b in range(3):
        o, _ = attention(f64(q2[2 * b:2 * b + 2]), batch.request_kv(b, 0),
                         batch.request_kv(b, 1), causal=True)
        check_close(out[2 * b:2 * b + 2], o, torch.bfloat16)
    for bad in (0, -1):  # FlashInfer's own test matches this message
        with pytest.raises(ValueError, match="q_len_per_req must be >= 1"):
            w.plan(batch.indptr, batch.indices, batch.last_page_len, 8, 2, 64, 16,
                   q_len_per_req=bad)
    with pytest.raises(kvattn.InvalidArgumentError, match="BatchDecodeWithPagedKVCacheWrapper"):
        kvattn.fast_decode_plan(object(), batch.indptr, batch.indices, batch.last_page_len, 8,
                                2, 64, 16)


def test_cuda_graph_decode_wrapper():
    batch = paged_batch([9, 33], 16, 1, 64, torch.float16)
    q = rand((2, 4, 64), torch.float16)
    w = kvattn.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
        workspace(), torch.empty(3, dtype=torch.int32), torch.empty(8, dtype=torch.int32),
        torch.empty(2, dtype=torch.int32))
    assert w.is_cuda_graph_enabled
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 4, 1, 64, 16)
    check_close(w.run(q, batch.cache), decode_ref(batch, q)[0], torch.float16)


# ---- the deprecated forward() takes its problem parameters (FlashInfer sets them for run) ----

def test_forward_honours_causal_sm_scale_and_soft_cap():
    batch = paged_batch([12, 20], 4, 2, 64, torch.float16)
    qo_indptr = torch.tensor([0, 5, 9], dtype=torch.int32)
    q = rand((9, 4, 64), torch.float16)
    w = kvattn.BatchPrefillWithPagedKVCacheWrapper(workspace())
    w.begin_forward(qo_indptr, batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 4)
    o, lse = w.forward_return_lse(q, batch.cache, causal=True, sm_scale=0.3,
                                  logits_soft_cap=9.0)
    ro, rl = prefill_ref(batch, q, qo_indptr, causal=True, sm_scale=0.3, soft_cap=9.0)
    check_close(o, ro, torch.float16)
    check_close(lse, rl * LOG2E, torch.float32, "lse", inputs_eps=2.0**-10)
    # and back to the defaults
    check_close(w.forward(q, batch.cache), prefill_ref(batch, q, qo_indptr)[0], torch.float16)
    # ragged
    k = rand((15, 2, 64), torch.float16)
    v = rand((15, 2, 64), torch.float16)
    kv_indptr = torch.tensor([0, 6, 15], dtype=torch.int32)
    r = kvattn.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    r.begin_forward(qo_indptr, kv_indptr, 4, 2, 64)
    o = r.forward(q, k, v, causal=True, sm_scale=0.25)
    for b in range(2):
        qs = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        ks = slice(int(kv_indptr[b]), int(kv_indptr[b + 1]))
        ro, _ = attention(f64(q[qs]), f64(k[ks]), f64(v[ks]), causal=True, sm_scale=0.25)
        check_close(o[qs], ro, torch.float16)
    # decode
    qd = rand((2, 4, 64), torch.float16)
    d = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace())
    d.begin_forward(batch.indptr, batch.indices, batch.last_page_len, 4, 2, 64, 4)
    check_close(d.forward(qd, batch.cache, sm_scale=0.4, logits_soft_cap=3.0),
                decode_ref(batch, qd, sm_scale=0.4, soft_cap=3.0)[0], torch.float16)


# ---- legacy shared-prefix wrappers ----

@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_shared_prefix_decode_and_prefill(kv_layout):
    prefix_len, heads, kv_heads, d, page = 21, 4, 2, 64, 8
    batch = paged_batch([5, 17, 9], page, kv_heads, d, torch.float16, kv_layout)
    k_sh = rand((prefix_len, kv_heads, d), torch.float16)
    v_sh = rand((prefix_len, kv_heads, d), torch.float16)
    form = (lambda x: x) if kv_layout == "NHD" else (lambda x: x.transpose(0, 1).contiguous())

    def full_kv(b, which):
        return np.concatenate([f64(k_sh if which == 0 else v_sh), batch.request_kv(b, which)])

    q = rand((3, heads, d), torch.float16)
    w = kvattn.BatchDecodeWithSharedPrefixPagedKVCacheWrapper(workspace(), kv_layout)
    w.begin_forward(batch.indptr, batch.indices, batch.last_page_len, heads, kv_heads, d, page,
                    "float16")
    out = w.forward(q, form(k_sh), form(v_sh), batch.cache)
    for b in range(3):
        o, _ = attention(f64(q[b:b + 1]), full_kv(b, 0), full_kv(b, 1))
        check_close(out[b:b + 1], o, torch.float16)

    qo_indptr = torch.tensor([0, 3, 10, 14], dtype=torch.int32)
    qp = rand((14, heads, d), torch.float16)
    p = kvattn.BatchPrefillWithSharedPrefixPagedKVCacheWrapper(workspace(), kv_layout)
    p.begin_forward(qo_indptr, batch.indptr, batch.indices, batch.last_page_len, heads,
                    kv_heads, d, page)
    out = p.forward(qp, form(k_sh), form(v_sh), batch.cache, causal=True, sm_scale=0.2)
    for b in range(3):
        r = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        m, n = r.stop - r.start, batch.kv_lens[b]
        # causal within the unique part (bottom-right), the prefix fully visible
        vis = np.concatenate([np.ones((m, prefix_len), bool),
                              np.arange(n)[None, :] <= np.arange(m)[:, None] + n - m], axis=1)
        o, _ = attention(f64(qp[r]), full_kv(b, 0), full_kv(b, 1), mask=vis, sm_scale=0.2)
        check_close(out[r], o, torch.float16)


# ---- BatchAttention, sink wrappers ----

def test_batch_attention_plans_from_kv_len_arr():
    batch = paged_batch([1, 30, 16, 47], 16, 2, 64, torch.bfloat16)
    qo_indptr = torch.tensor([0, 1, 6, 7, 12], dtype=torch.int32)
    q = rand((12, 8, 64), torch.bfloat16)
    kv_len_arr = torch.tensor(batch.kv_lens, dtype=torch.int32)
    a = kvattn.BatchAttention(device="cpu")
    a.plan(qo_indptr, batch.indptr, batch.indices, kv_len_arr, 8, 2, 64, 64, 16, causal=True,
           sm_scale=0.15)
    out, lse = a.run(q, batch.cache)
    ro, rl = prefill_ref(batch, q, qo_indptr, causal=True, sm_scale=0.15)
    check_close(out, ro, torch.bfloat16)
    check_close(lse, rl * LOG2E, torch.float32, "lse", inputs_eps=2.0**-8)
    with pytest.raises(kvattn.InvalidArgumentError, match="kv_len_arr"):
        a.plan(qo_indptr, batch.indptr, batch.indices, kv_len_arr[:3], 8, 2, 64, 64, 16)


def test_attention_sink_wrappers():
    batch = paged_batch([10, 37], 16, 2, 64, torch.bfloat16)
    sinks = torch.randn(8, dtype=torch.float32)
    qo_indptr = torch.tensor([0, 4, 9], dtype=torch.int32)
    q = rand((9, 8, 64), torch.bfloat16)
    w = kvattn.BatchAttentionWithAttentionSinkWrapper(workspace(), q_data_type=torch.bfloat16,
                                                      head_dim_qk=64, head_dim_vo=64)
    w.plan(qo_indptr, batch.indptr, batch.indices, batch.last_page_len, 8, 2, 64, 16,
           causal=True, q_data_type=torch.bfloat16)
    out = w.run(q, batch.cache, sinks, 0.11)
    ro, _ = prefill_ref(batch, q, qo_indptr, causal=True, sm_scale=0.11, sinks=f64(sinks))
    check_close(out, ro, torch.bfloat16)
    qd = rand((2, 8, 64), torch.bfloat16)
    d = kvattn.BatchDecodeWithAttentionSinkWrapper(workspace(), head_dim_qk=64, head_dim_vo=64)
    d.plan(batch.indptr, batch.indices, batch.last_page_len, 8, 2, 64, 16,
           q_data_type=torch.bfloat16)
    check_close(d.run(qd, batch.cache, sinks, 0.11),
                decode_ref(batch, qd, sm_scale=0.11, sinks=f64(sinks))[0], torch.bfloat16)


# ---- POD ----

def test_pod_wrappers():
    heads, kv_heads, d, page = 4, 2, 64, 16
    batch = paged_batch([20, 3, 50], page, kv_heads, d, torch.float16)
    qd = rand((3, heads, d), torch.float16)
    qp = rand((6, heads, d), torch.float16)
    kp = rand((11, kv_heads, d), torch.float16)
    vp = rand((11, kv_heads, d), torch.float16)
    w = kvattn.PODWithPagedKVCacheWrapper(workspace())
    w.plan(batch.indptr, batch.indices, batch.last_page_len, heads, kv_heads, d, page)
    out_p, out_d = w.run(qp, kp, vp, qd, batch.cache, causal_p=True, sm_scale_d=0.2)
    check_close(out_p, attention(f64(qp), f64(kp), f64(vp), causal=True)[0], torch.float16)
    check_close(out_d, decode_ref(batch, qd, sm_scale=0.2)[0], torch.float16)
    with pytest.raises(kvattn.NotSupportedError, match="custom_mask_d"):
        w.run(qp, kp, vp, qd, batch.cache, custom_mask_d=torch.ones(3, dtype=torch.bool))

    pre = paged_batch([30, 12], page, kv_heads, d, torch.float16)
    qo_p = torch.tensor([0, 7, 12], dtype=torch.int32)
    qo_d = torch.arange(4, dtype=torch.int32)
    q_p = rand((12, heads, d), torch.float16)
    b = kvattn.BatchPODWithPagedKVCacheWrapper(workspace())
    b.plan(qo_p, pre.indptr, pre.indices, pre.last_page_len, qo_d, batch.indptr,
           batch.indices, batch.last_page_len, heads, kv_heads, d, page)
    (op, lp), (od, ld) = b.run(q_p, pre.cache, qd, batch.cache, causal_p=True,
                               return_lse=True)
    ro, rl = prefill_ref(pre, q_p, qo_p, causal=True)
    check_close(op, ro, torch.float16)
    check_close(lp, rl * LOG2E, torch.float32, "lse", inputs_eps=2.0**-10)
    check_close(od, decode_ref(batch, qd)[0], torch.float16)


# ---- fused RoPE + FP8 quantization [+ append] ----

def cos_sin_cache(max_pos, rotary_dim, theta=1e4):
    t = np.arange(rotary_dim // 2)
    ang = np.arange(max_pos)[:, None] * theta ** (-2.0 * t / rotary_dim)[None, :]
    return torch.from_numpy(np.concatenate([np.cos(ang), np.sin(ang)], 1).astype(np.float32))


def check_fp8(got, ref, dtype, what):
    """got (fp8) is ref (fp64) rounded once: within half an fp8 step, plus the f32 RoPE's own
    error, relative; the smallest subnormal step absolute."""
    assert got.dtype == dtype, what
    mant = 3 if dtype == torch.float8_e4m3fn else 2
    tiny = 2.0 ** -9 if dtype == torch.float8_e4m3fn else 2.0 ** -16
    err = np.abs(f64(got) - ref)
    bound = (2.0 ** -(mant + 1) + 2.0 ** -16) * np.abs(ref) + tiny
    assert np.all(err <= bound), f"{what}: max excess {(err - bound).max():.3g}"


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("is_neox", [True, False])
def test_rope_quantize_fp8_gqa_and_mla(dtype, is_neox):
    nnz, hq, hk, rd, nd = 7, 4, 2, 64, 32
    cache = cos_sin_cache(100, rd)
    pos = torch.tensor([0, 3, 99, 17, 5, 42, 8], dtype=torch.int32)
    q_rope, q_nope = rand((nnz, hq, rd), torch.bfloat16), rand((nnz, hq, nd), torch.bfloat16)
    k_rope, k_nope = rand((nnz, hk, rd), torch.bfloat16), rand((nnz, hk, nd), torch.bfloat16)
    qr, kr, qn, kn = kvattn.rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cache, pos,
                                              is_neox=is_neox, quantize_dtype=dtype,
                                              quant_scale_q=3.0, quant_scale_kv=0.5)
    p = pos.numpy()
    check_fp8(qr, rope(f64(q_rope), p, interleave=not is_neox) * 3.0, dtype, "q_rope_out")
    check_fp8(kr, rope(f64(k_rope), p, interleave=not is_neox) * 0.5, dtype, "k_rope_out")
    check_fp8(qn, f64(q_nope) * 3.0, dtype, "q_nope_out")
    check_fp8(kn, f64(k_nope) * 0.5, dtype, "k_nope_out")
    # MLA: 2-D keys; preallocated outputs fix the dtype; a big scale saturates.
    k2, kn2 = rand((nnz, rd), torch.bfloat16), rand((nnz, 512), torch.bfloat16)
    outs = [torch.empty((nnz, hq, rd), dtype=dtype), torch.empty((nnz, rd), dtype=dtype),
            torch.empty((nnz, hq, nd), dtype=dtype), torch.empty((nnz, 512), dtype=dtype)]
    got = kvattn.mla_rope_quantize_fp8(q_rope, k2, q_nope, kn2, cache, pos, is_neox, None,
                                       1.0, 1e6, *outs)
    assert all(g is o for g, o in zip(got, outs))
    fmax = 448.0 if dtype == torch.float8_e4m3fn else 57344.0
    want_k = np.clip(rope(f64(k2)[:, None], p, interleave=not is_neox)[:, 0] * 1e6, -fmax, fmax)
    check_fp8(outs[1], want_k, dtype, "k_rope_out (saturating)")
    check_fp8(outs[3], np.clip(f64(kn2) * 1e6, -fmax, fmax), dtype, "k_nope_out")
    # q_nope None: zero-width outputs
    _, _, qn0, _ = kvattn.rope_quantize_fp8(q_rope, k_rope, None, None, cache, pos)
    assert qn0.shape == (nnz, hq, 0)
    with pytest.raises(kvattn.NotSupportedError, match="backend"):
        kvattn.rope_quantize_fp8(q_rope, k_rope, None, None, cache, pos, backend="cutile")
    with pytest.raises(kvattn.InvalidArgumentError, match="cos_sin_cache"):
        kvattn.rope_quantize_fp8(q_rope, k_rope, None, None, cache.double(), pos)


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_rope_quantize_fp8_append_paged_kv_cache(kv_layout):
    dtype, page = torch.float8_e4m3fn, 4
    hq, hk, rd, nd = 4, 2, 32, 32
    d = rd + nd
    cache_pos = cos_sin_cache(64, rd)
    kv_indptr = torch.tensor([0, 2, 5], dtype=torch.int32)
    kv_indices = torch.tensor([4, 0, 2, 5, 1], dtype=torch.int32)
    shape = (6, page, hk, d) if kv_layout == "NHD" else (6, hk, page, d)
    k_cache = torch.randint(0, 256, shape, dtype=torch.uint8).view(dtype)
    v_cache = torch.randint(0, 256, shape, dtype=torch.uint8).view(dtype)
    k0, v0 = k_cache.clone(), v_cache.clone()
    # 3 real rows and 2 padded ones (batch index -1)
    batch_indices = torch.tensor([1, -1, 0, 1, -1], dtype=torch.int32)
    positions = torch.tensor([9, 0, 2, 4, 0], dtype=torch.int32)
    # a padded row's pos_ids entry is not read (here past the cos/sin cache)
    pos_ids = torch.tensor([9, 1 << 20, 2, 4, -3], dtype=torch.int32)
    nnz = 5
    q_rope, q_nope = rand((nnz, hq, rd), torch.bfloat16), rand((nnz, hq, nd), torch.bfloat16)
    k_rope, k_nope = rand((nnz, hk, rd), torch.bfloat16), rand((nnz, hk, nd), torch.bfloat16)
    v = rand((nnz, hk, d), torch.bfloat16)
    qr, qn = kvattn.rope_quantize_fp8_append_paged_kv_cache(
        q_rope, k_rope, q_nope, k_nope, v, cache_pos, pos_ids, (k_cache, v_cache), kv_indices,
        kv_indptr, batch_indices, positions, quant_scale_q=2.0, quant_scale_kv=0.5,
        page_size=page, kv_layout=kv_layout)
    p = pos_ids.numpy()
    real = (batch_indices >= 0).numpy()
    check_fp8(qr[real], rope(f64(q_rope), p)[real] * 2.0, dtype, "q_rope_out")
    check_fp8(qn, f64(q_nope) * 2.0, dtype, "q_nope_out")
    k_ref = np.concatenate([rope(f64(k_rope), np.where(real, p, 0)), f64(k_nope)], axis=-1) * 0.5
    want_k, want_v = k0.clone(), v0.clone()
    for i in range(nnz):
        b = int(batch_indices[i])
        if b < 0:
            continue
        pg = int(kv_indices[int(kv_indptr[b]) + int(positions[i]) // page])
        s = int(positions[i]) % page
        got_k = k_cache[pg, s] if kv_layout == "NHD" else k_cache[pg, :, s]
        got_v = v_cache[pg, s] if kv_layout == "NHD" else v_cache[pg, :, s]
        check_fp8(got_k, k_ref[i], dtype, f"k row {i}")
        check_fp8(got_v, f64(v[i]) * 0.5, dtype, f"v row {i}")
        for want, got in ((want_k, got_k), (want_v, got_v)):
            if kv_layout == "NHD":
                want[pg, s] = got
            else:
                want[pg, :, s] = got
    # nothing but the 3 real rows' slots changed (byte for byte)
    assert torch.equal(k_cache.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), want_v.view(torch.uint8))


def test_rope_quantize_fp8_append_mla():
    dtype, page, rd, dc = torch.float8_e4m3fn, 4, 64, 128
    cache_pos = cos_sin_cache(32, rd)
    ckv = torch.zeros((3, page, dc), dtype=dtype)
    kpe = torch.zeros((3, page, rd), dtype=dtype)
    kv_indptr = torch.tensor([0, 1, 3], dtype=torch.int32)
    kv_indices = torch.tensor([2, 0, 1], dtype=torch.int32)
    bi = torch.tensor([0, 1, -1], dtype=torch.int32)
    pos = torch.tensor([3, 6, 0], dtype=torch.int32)
    q_rope, q_nope = rand((3, 8, rd), torch.bfloat16), rand((3, 8, dc), torch.bfloat16)
    k_rope, k_nope = rand((3, rd), torch.bfloat16), rand((3, dc), torch.bfloat16)
    kvattn.rope_quantize_fp8_append_paged_kv_cache(
        q_rope, k_rope, q_nope, k_nope, None, cache_pos, pos, (ckv, kpe), kv_indices, kv_indptr,
        bi, pos, page_size=page)
    p = pos.numpy()
    kr = rope(f64(k_rope)[:, None], p)[:, 0]
    check_fp8(kpe[2, 3], kr[0], dtype, "kpe row 0")
    check_fp8(ckv[2, 3], f64(k_nope[0]), dtype, "ckv row 0")
    check_fp8(kpe[1, 2], kr[1], dtype, "kpe row 1")
    written = torch.zeros(3, page, dtype=torch.bool)
    written[2, 3] = written[1, 2] = True
    assert torch.all(ckv.view(torch.uint8)[~written] == 0)  # the padded row wrote nothing
    with pytest.raises(kvattn.InvalidArgumentError, match="v: must be None"):
        kvattn.rope_quantize_fp8_append_paged_kv_cache(
            q_rope, k_rope, q_nope, k_nope, k_nope, cache_pos, pos, (ckv, kpe), kv_indices,
            kv_indptr, bi, pos, page_size=page)


def test_single_prefill_return_lse():
    q = rand((5, 4, 64), torch.float16)
    k = rand((9, 2, 64), torch.float16)
    v = rand((9, 2, 64), torch.float16)
    o, lse = kvattn.single_prefill_with_kv_cache_return_lse(q, k, v, causal=True)
    ro, rl = attention(f64(q), f64(k), f64(v), causal=True)
    check_close(o, ro, torch.float16)
    check_close(lse, rl * LOG2E, torch.float32, "lse", inputs_eps=2.0**-10)

"""The package on CUDA torch tensors (issue 21): the three batch wrappers, single decode and
prefill, merge_state(s) and append_paged_kv_cache with every tensor on device="cuda", against the
fp64 numpy reference, and torch's current stream honoured (a run enqueued on a side stream sees
what that stream wrote before it, and nothing on the default stream waits for it).

Where there is no CUDA device, or the package was built without CUDA support, every test here
skips with the reason. On a GPU machine: scripts/gpu-python.sh (docs/cuda.md)."""

import math

import numpy as np
import pytest
import torch

import kvattn
from conftest import paged_batch, rand
from reference import attention, check_close, f64


def _why_no_cuda():
    if not torch.cuda.is_available():
        return ("no CUDA device: torch.cuda.is_available() is False (these tests run on a GPU "
                "machine: scripts/gpu-python.sh)")
    info = kvattn.devices()
    if not info.get("cuda"):
        return f"kvattn sees no CUDA device: {info.get('cuda_status') or 'none'}"
    return None


_WHY = _why_no_cuda()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

LOG2E = 1 / math.log(2)
# The CUDA kernels round P to the query's 16-bit type before P.V (tensor-core operands).
P_ROUNDING = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
CUDA_BACKENDS = ("fa2", "fa3")
# Every case here is bf16 (or bf16 q over e4m3) at head dim 128: the kernels of the default (CI)
# build, which scripts/gpu-python.sh compiles.


def cuda_workspace():
    return torch.empty(64 << 20, dtype=torch.uint8, device="cuda")


def on_cuda(batch):
    """The paged batch's cache on the GPU (its index tensors stay on the host: plan reads them
    there)."""
    batch.cache = batch.cache.cuda()
    return batch


def host_batch_kv(batch, b, which):
    """K (0) / V (1) of request b as fp64 [len, H, D], read from the (device) cache."""
    cache = batch.cache
    batch.cache = cache.cpu()
    try:
        return batch.request_kv(b, which)
    finally:
        batch.cache = cache


def ragged_indptr(lens):
    return torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)


def reference_rows(q, k, v, **kw):
    return attention(f64(q), f64(k), f64(v), **kw)


@pytest.mark.parametrize("kv_name", ["bf16", "e4m3"])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_batch_decode_on_cuda(kv_name, kv_layout):
    kvd = {"bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}[kv_name]
    batch = on_cuda(paged_batch([0, 5, 16, 17, 300], 16, 8, 128, kvd, kv_layout))
    q = rand((5, 32, 128), torch.bfloat16).cuda()
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(cuda_workspace(), kv_layout)
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 32, 8, 128, 16,
           q_data_type=torch.bfloat16, kv_data_type=kvd)
    assert w.backend in CUDA_BACKENDS, w.backend
    out, lse = w.run(q, batch.cache, return_lse=True)
    assert out.is_cuda and lse.is_cuda and out.shape == (5, 32, 128)
    torch.cuda.synchronize()
    for b in range(5):
        o, l = reference_rows(q[b:b + 1].cpu(), host_batch_kv(batch, b, 0),
                              host_batch_kv(batch, b, 1))
        check_close(out[b:b + 1].cpu(), o, torch.bfloat16, inputs_eps=P_ROUNDING[torch.bfloat16])
        check_close(lse[b:b + 1].cpu(), l * LOG2E, torch.float32, "lse", inputs_eps=2.0**-12)
    assert torch.all(out[0] == 0) and torch.all(torch.isneginf(lse[0]))  # no keys


@pytest.mark.parametrize("causal", [False, True])
def test_batch_prefill_paged_on_cuda(causal):
    qo_lens, kv_lens = [1, 17, 130, 64], [9, 40, 200, 64]
    batch = on_cuda(paged_batch(kv_lens, 16, 2, 128, torch.bfloat16))
    qo = ragged_indptr(qo_lens)
    q = rand((sum(qo_lens), 8, 128), torch.bfloat16).cuda()
    w = kvattn.BatchPrefillWithPagedKVCacheWrapper(cuda_workspace())
    w.plan(qo, batch.indptr, batch.indices, batch.last_page_len, 8, 2, 128, 16, causal=causal,
           q_data_type=torch.bfloat16)
    assert w.backend in CUDA_BACKENDS, w.backend
    out, lse = w.run(q, batch.cache, return_lse=True)
    assert out.is_cuda
    torch.cuda.synchronize()
    for b in range(len(qo_lens)):
        rows = slice(int(qo[b]), int(qo[b + 1]))
        o, l = reference_rows(q[rows].cpu(), host_batch_kv(batch, b, 0),
                              host_batch_kv(batch, b, 1), causal=causal)
        check_close(out[rows].cpu(), o, torch.bfloat16, inputs_eps=P_ROUNDING[torch.bfloat16])
        check_close(lse[rows].cpu(), l * LOG2E, torch.float32, "lse", inputs_eps=2.0**-12)


def test_batch_prefill_ragged_on_cuda():
    qo_lens, kv_lens = [3, 64, 129], [3, 100, 129]
    qo, kv = ragged_indptr(qo_lens), ragged_indptr(kv_lens)
    q = rand((sum(qo_lens), 16, 128), torch.bfloat16).cuda()
    k = rand((sum(kv_lens), 2, 128), torch.bfloat16).cuda()
    v = rand((sum(kv_lens), 2, 128), torch.bfloat16).cuda()
    w = kvattn.BatchPrefillWithRaggedKVCacheWrapper(cuda_workspace())
    w.plan(qo, kv, 16, 2, 128, causal=True, q_data_type=torch.bfloat16)
    assert w.backend in CUDA_BACKENDS, w.backend
    out = w.run(q, k, v)
    torch.cuda.synchronize()
    for b in range(3):
        rows, keys = slice(int(qo[b]), int(qo[b + 1])), slice(int(kv[b]), int(kv[b + 1]))
        o, _ = reference_rows(q[rows].cpu(), k[keys].cpu(), v[keys].cpu(), causal=True)
        check_close(out[rows].cpu(), o, torch.bfloat16, inputs_eps=P_ROUNDING[torch.bfloat16])


def test_single_decode_and_prefill_on_cuda():
    k = rand((77, 4, 128), torch.bfloat16).cuda()
    v = rand((77, 4, 128), torch.bfloat16).cuda()
    q1 = rand((16, 128), torch.bfloat16).cuda()
    out = kvattn.single_decode_with_kv_cache(q1, k, v)
    assert out.is_cuda and out.shape == (16, 128)
    torch.cuda.synchronize()
    o, _ = reference_rows(q1.cpu()[None], k.cpu(), v.cpu())
    check_close(out.cpu(), o[0], torch.bfloat16, inputs_eps=P_ROUNDING[torch.bfloat16])

    q = rand((40, 16, 128), torch.bfloat16).cuda()
    out, lse = kvattn.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    assert out.is_cuda and lse.is_cuda
    torch.cuda.synchronize()
    o, l = reference_rows(q.cpu(), k.cpu(), v.cpu(), causal=True)
    check_close(out.cpu(), o, torch.bfloat16, inputs_eps=P_ROUNDING[torch.bfloat16])
    check_close(lse.cpu(), l * LOG2E, torch.float32, "lse", inputs_eps=2.0**-12)


def merge_ref(vs, ss):
    """fp64 merge of states (base-2 LSE)."""
    v = np.stack([f64(x) for x in vs])           # [S, N, H, D]
    s = np.stack([f64(x) for x in ss])           # [S, N, H]
    m = np.max(s, axis=0)
    safe = np.where(np.isfinite(m), m, 0.0)
    w = np.where(np.isfinite(s), np.exp2(s - safe), 0.0)
    tot = w.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(tot[..., None] > 0, (w[..., None] * v).sum(axis=0) /
                       np.where(tot > 0, tot, 1)[..., None], 0.0)
        lse = np.where(tot > 0, safe + np.log2(np.where(tot > 0, tot, 1)), -np.inf)
    return out, lse


def test_merge_state_and_states_on_cuda():
    v_a, v_b = rand((7, 4, 128), torch.bfloat16).cuda(), rand((7, 4, 128), torch.bfloat16).cuda()
    s_a, s_b = (torch.randn(7, 4) * 3).cuda(), (torch.randn(7, 4) * 3).cuda()
    s_a[0, 0] = -math.inf  # the identity state
    v, s = kvattn.merge_state(v_a, s_a, v_b, s_b)
    assert v.is_cuda and s.is_cuda
    torch.cuda.synchronize()
    ro, rl = merge_ref([v_a, v_b], [s_a, s_b])
    check_close(v.cpu(), ro, torch.bfloat16)
    check_close(s.cpu(), rl, torch.float32, "s")

    vs = rand((5, 3, 4, 128), torch.bfloat16).cuda()
    ss = (torch.randn(5, 3, 4) * 2).cuda()
    vo, so = kvattn.merge_states(vs, ss)
    assert vo.is_cuda and so.is_cuda
    torch.cuda.synchronize()
    ro, rl = merge_ref([vs[:, i] for i in range(3)], [ss[:, i] for i in range(3)])
    check_close(vo.cpu(), ro, torch.bfloat16)
    check_close(so.cpu(), rl, torch.float32, "s")


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_append_paged_kv_cache_on_cuda(cache_dtype):
    batch = on_cuda(paged_batch([5, 9], 4, 2, 128, cache_dtype))
    before = batch.cache.clone()
    append_indptr = torch.tensor([0, 2, 5], dtype=torch.int32)
    seq_lens = kvattn.get_seq_lens(batch.indptr, batch.last_page_len, 4)
    b, p = kvattn.get_batch_indices_positions(append_indptr, seq_lens, 5)
    k = rand((5, 2, 128), torch.bfloat16, scale=100.0).cuda()
    v = rand((5, 2, 128), torch.bfloat16).cuda()
    # the data on the GPU, the index tensors on the host (PYTHON_API.md: kvattn reads them there)
    kvattn.append_paged_kv_cache(k, v, b, p, batch.cache, batch.indices, batch.indptr,
                                 batch.last_page_len)
    torch.cuda.synchronize()
    cache, before = batch.cache.cpu(), before.cpu()
    written = torch.zeros(cache.shape[0], 4, dtype=torch.bool)
    as_bits = (lambda t: t.view(torch.uint8)) if cache_dtype.itemsize == 1 else (lambda t: t)
    for i in range(5):
        req, pos = int(b[i]), int(p[i])
        page = int(batch.indices[int(batch.indptr[req]) + pos // 4])
        written[page, pos % 4] = True
        for which, src in ((0, k), (1, v)):
            want = src[i].cpu().float().to(cache_dtype)  # RNE, saturating as torch casts
            assert torch.equal(as_bits(cache[page, which, pos % 4]), as_bits(want))
    for page in range(cache.shape[0]):
        for slot in range(4):
            if not written[page, slot]:
                assert torch.equal(as_bits(cache[page, :, slot]), as_bits(before[page, :, slot]))


def test_run_uses_torchs_current_stream():
    """q is written on a side stream after a long sleep there; run enqueued under that stream
    must see it (on any other stream it would read q before the write). torch's pool streams
    are non-blocking, so the legacy default stream would not wait for the side stream."""
    batch = on_cuda(paged_batch([256, 1000], 16, 8, 128, torch.bfloat16))
    q_src = rand((2, 32, 128), torch.bfloat16).cuda()
    q = torch.zeros_like(q_src)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(cuda_workspace())
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 32, 8, 128, 16,
           q_data_type=torch.bfloat16)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles before q is written
        q.copy_(q_src)
        out = w.run(q, batch.cache)
        done = torch.cuda.Event()
        done.record(side)
    assert not done.query(), "the side stream finished before the sleep could have"
    side.synchronize()
    for b in range(2):
        o, _ = reference_rows(q_src[b:b + 1].cpu(), host_batch_kv(batch, b, 0),
                              host_batch_kv(batch, b, 1))
        check_close(out[b:b + 1].cpu(), o, torch.bfloat16, inputs_eps=P_ROUNDING[torch.bfloat16])

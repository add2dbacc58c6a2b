"""What kvattn promises beyond the math: FlashInfer's documented call sequences run unchanged,
zero copy (results land in out=, strided views are read where they lie), errors are
kvattn.Error subclasses with the C++ message and leave outputs untouched, run refuses tensors
that disagree with the plan, two threads run two wrappers at once, explain/backends."""

import math
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import kvattn
from conftest import paged_batch, rand, workspace
from reference import attention, check_close, f64

ROOT = Path(__file__).resolve().parents[2]


def decode_setup(kv_dtype=torch.float16, lens=(10, 30, 47)):
    batch = paged_batch(list(lens), 16, 2, 64, kv_dtype)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 8, 2, 64, 16,
           q_data_type=torch.float16, kv_data_type=kv_dtype)
    return batch, w


def test_flashinfer_dropin_example_runs():
    r = subprocess.run([sys.executable, str(ROOT / "examples/python/flashinfer_dropin.py"),
                        "--layers", "4"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "backend cpu" in r.stdout


def test_flashinfer_prefill_doc_sequence():
    import kvattn as flashinfer
    num_layers, num_qo_heads, num_kv_heads, head_dim = 2, 8, 2, 64
    max_num_pages, page_size = 16, 4
    workspace_buffer = torch.zeros(16 * 1024 * 1024, dtype=torch.uint8)
    prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace_buffer, "NHD")
    nnz_qo = 20
    qo_indptr = torch.tensor([0, 6, 13, 20], dtype=torch.int32)
    paged_kv_indices = torch.arange(max_num_pages).int()
    paged_kv_indptr = torch.tensor([0, 5, 9, 16], dtype=torch.int32)
    paged_kv_last_page_len = torch.tensor([1, 3, 4], dtype=torch.int32)
    kv_cache_at_layer = torch.randn(num_layers, max_num_pages, 2, page_size, num_kv_heads,
                                    head_dim, dtype=torch.float16)
    prefill_wrapper.plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                         num_qo_heads, num_kv_heads, head_dim, page_size, causal=True)
    for i in range(num_layers):
        q = torch.randn(nnz_qo, num_qo_heads, head_dim).half()
        o = prefill_wrapper.run(q, kv_cache_at_layer[i])
        assert o.shape == (nnz_qo, num_qo_heads, head_dim)
        assert torch.isfinite(o).all()


def test_results_land_in_out_and_inputs_are_read_in_place():
    batch, w = decode_setup()
    # q as a strided view (every other head of a wider tensor): read where it lies
    wide = rand((3, 16, 64), torch.float16)
    q = wide[:, ::2]
    assert not q.is_contiguous()
    out = torch.empty(3, 8, 64, dtype=torch.float16)
    lse = torch.empty(3, 8)
    ptrs = (out.data_ptr(), lse.data_ptr())
    res, res_lse = w.run(q, batch.cache, out=out, lse=lse, return_lse=True)
    assert res is out and res_lse is lse and (out.data_ptr(), lse.data_ptr()) == ptrs
    assert torch.equal(w.run(q.contiguous(), batch.cache), out)
    # the kernel reads the cache itself: a change to it shows in the next run
    batch.cache[:, 1] = 0
    assert torch.all(w.run(q, batch.cache) == 0)


def test_bad_inputs_raise_and_leave_outputs_untouched():
    batch, w = decode_setup()
    q = rand((3, 8, 64), torch.float16)
    out = torch.full((3, 8, 64), 5.0, dtype=torch.float16)
    cases = [
        (q.float(), batch.cache, out, kvattn.InvalidDTypeError, "q"),        # dtype != plan
        (q[:2], batch.cache, out[:2], kvattn.InvalidShapeError, "q"),        # rows != batch
        (q, batch.cache.float(), out, kvattn.InvalidDTypeError, "paged_k_cache"),
        (q, batch.cache[:4], out, kvattn.InvalidPageTableError, "kv_indices"),  # ids past cache
        (q, batch.cache, out[:, :4], kvattn.InvalidShapeError, "out"),
        (q, batch.cache, q, kvattn.AliasingError, "out"),
    ]
    for qq, cache, o, err, name in cases:
        before = o.clone()
        with pytest.raises(err) as info:
            w.run(qq, cache, out=o)
        assert name in str(info.value)
        assert isinstance(info.value, (ValueError, RuntimeError)) and \
            isinstance(info.value, kvattn.Error)
        assert torch.equal(o, before)
    with pytest.raises(kvattn.InvalidPageTableError):  # plan checks the page table
        w.plan(torch.tensor([0, 2, 1], dtype=torch.int32), batch.indices, batch.last_page_len[:2],
               8, 2, 64, 16)
    with pytest.raises(kvattn.InvalidShapeError):
        w.plan(batch.indptr, batch.indices, batch.last_page_len, 6, 4, 64, 16)  # 6 % 4
    with pytest.raises(kvattn.NotSupportedError):
        w.run(q, batch.cache, skip_softmax_threshold_scale_factor=0.5)
    with pytest.raises(kvattn.InvalidArgumentError):
        w.run(q, batch.cache, sinks=torch.full((8,), math.inf))  # sinks must be finite
    with pytest.raises(TypeError):
        w.plan(batch.indptr, batch.indices, batch.last_page_len, 8, 2, 64, 16, no_such_arg=1)


def test_explicit_backend_errors_at_plan():
    batch = paged_batch([5], 16, 2, 64, torch.float16)
    for backend, err in (("fa3", kvattn.NotSupportedError), ("fa2", kvattn.NotSupportedError)):
        w = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace(), backend=backend)
        with pytest.raises(err) as info:
            w.plan(batch.indptr, batch.indices, batch.last_page_len, 8, 2, 64, 16)
        assert backend in str(info.value) and "cpu would run it" in str(info.value)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace(), backend="reference")
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 8, 2, 64, 16)
    assert w.backend == "reference"
    with pytest.raises(kvattn.InvalidArgumentError):
        kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace(), backend="triton")


def test_explain_founding_case():
    e = kvattn.explain("batch_prefill_paged", device="cuda:sm90", q_data_type=torch.bfloat16,
                       kv_data_type="float8_e4m3fn")
    assert e["selected"] == "fa2"
    fa3 = next(v for v in e["verdicts"] if v["backend"] == "fa3")
    assert not fa3["supported"] and "FP8 KV" in fa3["reason"]
    assert kvattn.explain("batch_decode")["selected"] == "cpu"
    # The cpu verdict names its kernel and the taller prefill tiles a plan may take instead.
    cpu = next(v for v in kvattn.explain("batch_prefill_paged", q_data_type=torch.bfloat16,
                                         kv_data_type=torch.bfloat16)["verdicts"]
               if v["backend"] == "cpu")
    assert cpu["cpu_kernel"].startswith("prefill-")
    assert isinstance(cpu["cpu_kernel_taller"], list)
    assert all(k.startswith(cpu["cpu_kernel"].rsplit("-r", 1)[0]) for k in cpu["cpu_kernel_taller"])
    # ... and the decode kernel a batch of one query token a request runs; none for a ragged cache.
    assert cpu["cpu_kernel_one_token"].startswith("decode-")
    ragged = next(v for v in kvattn.explain("batch_prefill_ragged", q_data_type=torch.bfloat16,
                                            kv_data_type=torch.bfloat16)["verdicts"]
                  if v["backend"] == "cpu")
    assert ragged["cpu_kernel_one_token"] is None
    assert set(kvattn.backend_names()) >= {"reference", "cpu", "fa2", "fa3"}
    assert kvattn.devices()["cpu_threads"] >= 1
    with pytest.raises(kvattn.InvalidArgumentError):
        kvattn.explain("batch_decode", no_such_field=1)


def test_two_threads_two_wrappers():
    setups = [decode_setup(torch.float16, (70, 5, 33)), decode_setup(torch.float8_e5m2, (40,) * 3)]
    qs = [rand((3, 8, 64), torch.float16) for _ in setups]
    expected = [w.run(q, b.cache) for (b, w), q in zip(setups, qs)]
    failures = []

    def worker(i):
        b, w = setups[i]
        for _ in range(50):
            if not torch.equal(w.run(qs[i], b.cache), expected[i]):
                failures.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_run_releases_the_gil():
    # While a long run holds no GIL, another Python thread keeps counting.
    batch = paged_batch([20000] * 4, 16, 8, 128, torch.float32)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 32, 8, 128, 16,
           q_data_type=torch.float32, num_threads=1)
    q = rand((4, 32, 128), torch.float32)
    ticks = []
    done = threading.Event()

    def counter():
        while not done.is_set():
            ticks.append(1)

    t = threading.Thread(target=counter)
    t.start()
    w.run(q, batch.cache)
    calls_during = len(ticks)
    done.set()
    t.join()
    assert calls_during > 100


def test_numpy_fp8_storage_with_planned_dtype():
    batch = paged_batch([12, 20], 4, 1, 64, torch.float8_e4m3fn)
    q = rand((2, 2, 64), torch.float16)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(np.empty(1 << 20, np.uint8))
    w.plan(batch.indptr.numpy(), batch.indices.numpy(), batch.last_page_len.numpy(), 2, 1, 64,
           4, q_data_type="float16", kv_data_type="float8_e4m3fn")
    out = w.run(q.numpy(), batch.cache.view(torch.uint8).numpy())
    assert isinstance(out, np.ndarray)
    assert np.array_equal(out, w.run(q.numpy(), batch.cache))  # torch fp8 cache, same bits

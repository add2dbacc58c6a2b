"""kvattn.threads: inside torch, kvattn's CPU work runs on torch's OpenMP team ("auto"), with the
same results as on its own threads."""

import pytest
import torch

import kvattn
from conftest import DTYPES, paged_batch, rand, workspace
from test_decode import reference_decode
from reference import check_close


@pytest.fixture(autouse=True)
def restore_mode():
    yield
    kvattn.set_cpu_threads("auto")


def test_auto_is_the_default_and_finds_torchs_runtime():
    assert kvattn.cpu_threads() == "auto"
    torch.set_num_threads(torch.get_num_threads())  # torch's OpenMP runtime is loaded by now
    runtime = kvattn.host_openmp_runtime()
    assert "omp" in runtime.rsplit("/", 1)[-1], runtime


def test_modes_and_refusal():
    for mode in ("own", "openmp", "auto"):
        kvattn.set_cpu_threads(mode)
        assert kvattn.cpu_threads() == mode
    with pytest.raises(kvattn.InvalidArgumentError, match="cpu_threads: 'omp'"):
        kvattn.set_cpu_threads("omp")
    assert kvattn.cpu_threads() == "auto"


@pytest.mark.parametrize("mode", ["own", "openmp"])
def test_decode_on_each_runtime_matches_the_reference(mode):
    kvattn.set_cpu_threads(mode)
    bf16 = DTYPES["bf16"]
    batch = paged_batch([1, 17, 300, 64, 1000, 33], 16, 2, 128, bf16)
    q = rand((6, 8, 128), bf16)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(batch.indptr, batch.indices, batch.last_page_len, 8, 2, 128, 16, q_data_type=bf16,
           kv_data_type=bf16, num_threads=2)
    out = w.run(q, batch.cache_form("single"))
    ref_o, _ = reference_decode(batch, q)
    check_close(out, ref_o, bf16)
    # The same items in the other mode: the same bytes (each item is computed alone).
    kvattn.set_cpu_threads("own" if mode == "openmp" else "openmp")
    assert torch.equal(w.run(q, batch.cache_form("single")), out)

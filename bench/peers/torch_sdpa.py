#!/usr/bin/env python3
"""PyTorch CPU scaled_dot_product_attention on the shapes of kvattn's standard bench cases.

Prints one JSON object per line: name, peer, median_ms, min_ms, repeats, threads, torch version,
and the aten kernel that SDPA dispatched to (read once with the profiler, outside the timing).

Torch has no paged KV cache: every tensor here is contiguous ([batch, heads, tokens, dim]),
which spares torch the page-table indirection that kvattn pays. GQA is either torch's own
enable_gqa flag ("-gqa") or K/V heads repeated to 32 before timing ("-repkv", not timed, so
that variant reads 4x the KV bytes but skips the expansion). SDPA has no fp8 path: the e4m3
case times the honest equivalent, dequantizing the e4m3 cache to bf16 with its scale and then
running SDPA, all inside the timed region.
"""

import argparse
import json
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F

N_QO_HEADS = 32
N_KV_HEADS = 8


# name -> (op, head_dim, batch, context, kv dtype of the kvattn case)
CASES = {
    "decode_llama3_8b_bf16": ("decode", 128, 16, 4096, "bf16"),
    "decode_llama3_8b_e4m3": ("decode", 128, 16, 4096, "e4m3"),
    "decode_long_b1": ("decode", 128, 1, 32768, "bf16"),
    "decode_d64_bf16": ("decode", 64, 16, 4096, "bf16"),
    "decode_d256_bf16": ("decode", 256, 16, 4096, "bf16"),
    "prefill_llama3_8b_causal": ("prefill", 128, 1, 4096, "bf16"),
    "prefill_d64_causal": ("prefill", 64, 1, 4096, "bf16"),
    "prefill_d256_causal": ("prefill", 256, 1, 4096, "bf16"),
    "prefill_short_b64_causal": ("prefill", 128, 64, 128, "bf16"),
}


def make_inputs(op, head_dim, batch, context, dtype, kv_heads):
    q_len = 1 if op == "decode" else context
    gen = torch.Generator().manual_seed(1234)
    q = torch.randn(batch, N_QO_HEADS, q_len, head_dim, generator=gen).to(dtype)
    k = torch.randn(batch, kv_heads, context, head_dim, generator=gen).to(dtype)
    v = torch.randn(batch, kv_heads, context, head_dim, generator=gen).to(dtype)
    return q, k, v


def sdpa_kernel_name(fn):
    """The aten op that SDPA ran (flash CPU kernel or the math fallback)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    names = {e.key for e in prof.key_averages()}
    for pattern in ("flash_attention", "_math", "efficient"):
        hits = sorted(n for n in names if re.search(pattern, n))
        if hits:
            return hits[0]
    return "unknown"


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


def variants(name, op, head_dim, batch, context, kv_kind, dtypes, gqa_modes):
    """Yields (peer label, callable) for one case."""
    causal = op == "prefill"
    for dtype_name in dtypes:
        dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype_name]
        for mode in gqa_modes:
            kv_heads = N_KV_HEADS if mode == "gqa" else N_QO_HEADS
            q, k, v = make_inputs(op, head_dim, batch, context, dtype, kv_heads)
            gqa = mode == "gqa"
            if kv_kind == "e4m3":
                if dtype_name != "bf16" or mode != "gqa":
                    continue
                scale_k, scale_v = 0.5, 0.25
                k8 = (k.float() / scale_k).to(torch.float8_e4m3fn)
                v8 = (v.float() / scale_v).to(torch.float8_e4m3fn)
                del k, v

                def run(q=q, k8=k8, v8=v8, sk=scale_k, sv=scale_v, gqa=gqa):
                    k16 = k8.to(torch.bfloat16) * sk
                    v16 = v8.to(torch.bfloat16) * sv
                    return F.scaled_dot_product_attention(q, k16, v16, is_causal=causal,
                                                          enable_gqa=gqa)

                yield f"torch-sdpa-e4m3-dequant-bf16-{mode}", run
            else:
                def run(q=q, k=k, v=v, gqa=gqa):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                          enable_gqa=gqa)

                yield f"torch-sdpa-{dtype_name}-{mode}", run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", default=".", help="regex over case names")
    parser.add_argument("--dtypes", default="bf16,f32", help="comma list of bf16,f32")
    parser.add_argument("--gqa", default="gqa", help="comma list of gqa,repkv")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, (op, head_dim, batch, context, kv_kind) in CASES.items():
            if not re.search(args.filter, name):
                continue
            for peer, fn in variants(name, op, head_dim, batch, context, kv_kind,
                                     args.dtypes.split(","), args.gqa.split(",")):
                median, best, cpu = time_ms(fn, args.repeats, args.warmup)
                print(json.dumps({
                    "name": name,
                    "peer": peer,
                    "median_ms": round(median, 4),
                    "min_ms": round(best, 4),
                    "median_cpu_ms": round(cpu, 4),
                    "repeats": args.repeats,
                    "threads": torch.get_num_threads(),
                    "torch": torch.__version__,
                    "kernel": sdpa_kernel_name(fn),
                }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

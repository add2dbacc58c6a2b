"""Python overhead of `run`: the FlashInfer-style wrapper's run() against the C++ kvattn::run on
the same plan and tensors, in one process, interleaved (benchmark, not test).

    python bench/python_overhead.py [--repeats N] [--json] [--tiny-only] [--layer-scales]

Cases: decode_llama3_8b_bf16 (the standard decode case: B 16, ctx 4096, page 16, 32/8 heads,
d 128) and a tiny decode (B 1, ctx 16) whose kernel time is small, to show the fixed cost; with
--layer-scales also the tiny decode over an e4m3 cache whose run is given k/v scales cycling over
32 layers' values (one plan for all: the per-layer values are run arguments).
Reports medians in µs and the goal: overhead <= 5 µs + 2 % of the kernel time."""

import argparse
import json
import statistics
import time

import torch

import kvattn
from kvattn import _kvattn


def case(batch, ctx, page=16, h_qo=32, h_kv=8, d=128, dtype=torch.bfloat16, kv_dtype=None):
    pages = (ctx + page - 1) // page
    total = batch * pages
    indptr = torch.arange(0, total + 1, pages, dtype=torch.int32)
    indices = torch.randperm(total, dtype=torch.int32)
    last = torch.full((batch,), ctx - (pages - 1) * page, dtype=torch.int32)
    cache = torch.randn(total, 2, page, h_kv, d).to(kv_dtype or dtype)
    q = torch.randn(batch, h_qo, d).to(dtype)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8))
    w.plan(indptr, indices, last, h_qo, h_kv, d, page, q_data_type=dtype, kv_data_type=kv_dtype)
    return w, q, cache


def measure(name, w, q, cache, repeats, layer_scales=(None,)):
    """layer_scales: the k/v scale of each layer's run, cycled (None: the run is given none)."""
    out = torch.empty_like(q)
    plan = w._plan  # the extension plan behind the wrapper, to time the C++ call on it
    tensors = dict(q=q, out=out, paged_kv_cache=cache)
    py, cpp = [], []
    for i in range(3):
        s = layer_scales[i % len(layer_scales)]
        w.run(q, cache, out=out, k_scale=s, v_scale=s)
    for i in range(repeats):
        s = layer_scales[i % len(layer_scales)]
        t = time.perf_counter()
        w.run(q, cache, out=out, k_scale=s, v_scale=s)
        py.append(time.perf_counter() - t)
        cpp.extend(_kvattn.time_cpp_run(plan.ext, tensors, 1))
    py_us, cpp_us = statistics.median(py) * 1e6, statistics.median(cpp) * 1e6
    overhead = py_us - cpp_us
    goal = 5.0 + 0.02 * cpp_us
    return {"case": name, "python_run_us": round(py_us, 2), "cpp_run_us": round(cpp_us, 2),
            "overhead_us": round(overhead, 2), "goal_us": round(goal, 2),
            "goal_met": overhead <= goal, "repeats": repeats}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--tiny-only", action="store_true",
                        help="the fixed cost only (the tiny decode), e.g. to alternate two builds")
    parser.add_argument("--layer-scales", action="store_true",
                        help="also the tiny decode over e4m3 with 32 layers' k/v scales")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = [measure("decode_tiny_b1_ctx16", *case(1, 16), args.repeats * 10)]
    if args.layer_scales:
        scales = tuple(0.01 + 0.001 * layer for layer in range(32))
        rows.append(measure("decode_tiny_e4m3_32_layer_scales",
                            *case(1, 16, kv_dtype=torch.float8_e4m3fn), args.repeats * 10, scales))
    if not args.tiny_only:
        rows.append(measure("decode_llama3_8b_bf16", *case(16, 4096), args.repeats))
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'case':26} {'python us':>10} {'C++ us':>10} {'overhead':>9} {'goal':>7}")
    for r in rows:
        print(f"{r['case']:26} {r['python_run_us']:10.1f} {r['cpp_run_us']:10.1f} "
              f"{r['overhead_us']:9.2f} {r['goal_us']:7.1f} {'met' if r['goal_met'] else 'NOT met'}")


if __name__ == "__main__":
    main()

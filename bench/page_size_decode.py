"""Decode per step at page_size 1 (engines with token-granular pages: SGLang's token pool, a
3-D (k, v) tuple, last_page_len all ones) against page_size 16, through the FlashInfer-style
wrapper, same tokens, same bytes read (benchmark, not test). Issue 20's bar: page_size 1 no
more than 1.3x slower per decode step at B 16 x 4k.

    python bench/page_size_decode.py [--repeats N] [--batch 16] [--ctx 4096]

Llama-3-8B decode shape: 32/8 heads, d 128, bf16 cache, randomly permuted pages (slots).
Slots: page_size 16 with randomly permuted pages; page_size 1 with randomly permuted tokens
(a fragmented pool) and with each request's tokens in order (a fresh pool). Reports medians of
run() (one layer's decode) and of plan() (once per step), in ms; two interleaved rounds, the
better median of the two."""

import argparse
import platform
import statistics
import time

import torch

import kvattn


def build(batch, ctx, page, slots="random", h_qo=32, h_kv=8, d=128, dtype=torch.bfloat16):
    pages = (ctx + page - 1) // page
    total = batch * pages
    indptr = torch.arange(0, total + 1, pages, dtype=torch.int32)
    # random: pages (for page_size 1: tokens) anywhere in the pool; sequential: each request's
    # in order (a fresh token pool hands out consecutive slots)
    indices = (torch.randperm(total, dtype=torch.int32) if slots == "random"
               else torch.arange(total, dtype=torch.int32))
    last = torch.full((batch,), ctx - (pages - 1) * page, dtype=torch.int32)
    if page == 1:  # SGLang's pool: k and v buffers [slots, H_kv, D]
        cache = (torch.randn(total, h_kv, d).to(dtype), torch.randn(total, h_kv, d).to(dtype))
    else:
        cache = torch.randn(total, 2, page, h_kv, d).to(dtype)
    q = torch.randn(batch, h_qo, d).to(dtype)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8))
    args = (indptr, indices, last, h_qo, h_kv, d, page)
    w.plan(*args, q_data_type=dtype, kv_data_type=dtype)
    return w, args, q, cache


def median_ms(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=4096)
    a = ap.parse_args()
    cpu = platform.processor() or platform.machine()
    print(f"CPU: {cpu} ({torch.get_num_threads()} torch threads); backend cpu; "
          f"B {a.batch} x ctx {a.ctx}, 32/8 heads, d 128, bf16; medians of {a.repeats}")
    res = {}
    # interleaved: both page sizes see the same machine noise
    cases = {"16 random": build(a.batch, a.ctx, 16), "1 random": build(a.batch, a.ctx, 1),
             "1 sequential": build(a.batch, a.ctx, 1, "sequential")}
    for _ in range(2):
        for p, (w, args, q, cache) in cases.items():
            out = torch.empty_like(q)
            run = median_ms(lambda: w.run(q, cache, out=out), a.repeats)
            plan = median_ms(lambda: w.plan(*args, q_data_type=q.dtype, kv_data_type=q.dtype),
                             max(3, a.repeats // 4))
            res.setdefault(p, []).append((run, plan))
    best = {}
    for p in cases:
        best[p] = min(r for r, _ in res[p])
        plan = min(pl for _, pl in res[p])
        print(f"page_size {p:13s}: run {best[p]:8.3f} ms   plan {plan:7.3f} ms   backend "
              f"{cases[p][0].backend}")
    for p in ("1 random", "1 sequential"):
        print(f"page_size {p} / page_size 16 random, run: {best[p] / best['16 random']:.2f}x "
              "(bar: <= 1.3x)")


if __name__ == "__main__":
    main()

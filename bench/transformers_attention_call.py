"""One transformers attention call (decode: q_len 1) on kvattn's integration against transformers'
"sdpa" function, at several key counts, inside torch (a torch op runs before each call, as in a
model, so torch's OpenMP workers are awake). Benchmark, not a test; the issue-19 model's shape:
16 query / 4 KV heads, head_dim 64, float32.

    python bench/transformers_attention_call.py [--repeats 200] [--contexts 16,512,4096]

Prints medians in µs for kvattn on torch's OpenMP team ("auto", all cores), kvattn on its own
single thread ("own", 1), and sdpa, interleaved per context."""

import argparse
import statistics
import time

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import kvattn
import kvattn.integrations.transformers as kt


class _Module(torch.nn.Module):
    is_causal = True
    num_key_value_groups = 4


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--contexts", default="16,512,4096")
    a = ap.parse_args()
    module, linear, x = _Module(), torch.nn.Linear(1024, 1024), torch.randn(1, 1024)
    print(f"torch threads {torch.get_num_threads()}, OpenMP runtime "
          f"{kvattn.host_openmp_runtime() or '(none)'}; medians of {a.repeats}, µs")
    for context in (int(c) for c in a.contexts.split(",")):
        q = torch.randn(1, 16, 1, 64)
        k, v = torch.randn(1, 4, context, 64), torch.randn(1, 4, context, 64)
        results = {}
        for name, mode, threads, fn in (("kvattn auto", "auto", 0, kt.attention_forward),
                                        ("kvattn own x1", "own", 1, kt.attention_forward),
                                        ("sdpa", None, None, sdpa_attention_forward)):
            if mode:
                kvattn.set_cpu_threads(mode)
                kt.num_threads = threads
            for _ in range(5):
                fn(module, q, k, v, None, scaling=0.125)
            times = []
            for _ in range(a.repeats):
                linear(x)
                t = time.perf_counter()
                fn(module, q, k, v, None, scaling=0.125)
                times.append(time.perf_counter() - t)
            results[name] = statistics.median(times) * 1e6
        kvattn.set_cpu_threads("auto")
        kt.num_threads = 0
        print(f"keys {context:6d}: " + "  ".join(f"{n} {t:8.1f}" for n, t in results.items()) +
              f"  sdpa / kvattn auto {results['sdpa'] / results['kvattn auto']:.2f}x")


if __name__ == "__main__":
    main()

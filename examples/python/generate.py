"""Greedy generation with transformers on kvattn's attention, against "sdpa", at several contexts.

A small Llama-architecture model is built from a LlamaConfig with random weights (fixed seed,
nothing downloaded): 2 layers, float32, hidden 1024, 16 query / 4 KV heads of head_dim 64. For
each context length it generates the same random prompt greedily with attn_implementation=
"kvattn" and with "sdpa", alternating, and prints per implementation the prefill rate (prompt
tokens/s) and the decode rate (generated tokens/s after the first token; a streamer timestamps
every token), medians over the repeats, and whether the tokens agree. Exits 1 if they do not.

    python examples/python/generate.py [--contexts 16,512,4096] [--tokens 32] [--threads 2]
                                       [--kvattn-threads N] [--repeats 3]
                                       [--cache dynamic|static]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.streamers import BaseStreamer

import kvattn.integrations.transformers as kvattn_transformers  # registers "kvattn"


def build_model(max_positions: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                         num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                         vocab_size=1000, max_position_embeddings=max_positions)
    return LlamaForCausalLM(config).eval()


class _Clock(BaseStreamer):
    """Timestamps of generate()'s pushes: the prompt first, then each new token."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def generate(model: LlamaForCausalLM, impl: str, prompt: torch.Tensor, tokens: int,
             cache: str) -> tuple[torch.Tensor, float, float]:
    """Greedy tokens after the prompt, prefill tokens/s and decode tokens/s of one call."""
    model.set_attn_implementation(impl)
    clock = _Clock()
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens,
                             do_sample=False, streamer=clock, **extra)
    first, last = clock.times[1], clock.times[-1]
    prefill = prompt.numel() / (first - start)
    decode = (tokens - 1) / (last - first) if tokens > 1 else float("nan")
    return out[:, prompt.shape[1]:], prefill, decode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="16,512,4096",
                        help="prompt lengths, comma separated (default 16,512,4096)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per call")
    parser.add_argument("--threads", type=int, default=2, help="torch's threads")
    parser.add_argument("--kvattn-threads", type=int, default=None,
                        help="kvattn's threads per attention call (default: the integration's "
                             "num_threads)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache", choices=("dynamic", "static"), default="dynamic",
                        help="transformers' KV cache (default: dynamic, generate()'s default)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.kvattn_threads is not None:
        kvattn_transformers.num_threads = args.kvattn_threads
    contexts = [int(c) for c in args.contexts.split(",")]

    model = build_model(max(contexts) + args.tokens)
    print(f"2-layer float32 Llama (hidden 1024, 16/4 heads, head_dim 64), torch threads "
          f"{args.threads}, kvattn threads {kvattn_transformers.num_threads}, {args.cache} cache, "
          f"{args.tokens} new tokens, median of {args.repeats}")
    print(f"{'context':>8} {'impl':>7} {'prefill tok/s':>14} {'decode tok/s':>13}")
    all_agree = True
    calls_before = kvattn_transformers.calls
    for context in contexts:
        prompt = torch.randint(0, model.config.vocab_size, (1, context),
                               generator=torch.Generator().manual_seed(1))
        generate(model, "kvattn", prompt, 2, args.cache)  # warm up both
        generate(model, "sdpa", prompt, 2, args.cache)
        rates: dict[str, tuple[list[float], list[float]]] = {"kvattn": ([], []),
                                                              "sdpa": ([], [])}
        tokens = {}
        for _ in range(args.repeats):  # alternate: the machine may be shared
            for impl in ("kvattn", "sdpa"):
                tokens[impl], prefill, decode = generate(model, impl, prompt, args.tokens,
                                                         args.cache)
                rates[impl][0].append(prefill)
                rates[impl][1].append(decode)
        medians = {impl: (statistics.median(p), statistics.median(d))
                   for impl, (p, d) in rates.items()}
        for impl in ("kvattn", "sdpa"):
            print(f"{context:>8} {impl:>7} {medians[impl][0]:>14.1f} {medians[impl][1]:>13.1f}")
        agree = torch.equal(tokens["kvattn"], tokens["sdpa"])
        print(f"{context:>8} kvattn/sdpa: prefill {medians['kvattn'][0] / medians['sdpa'][0]:.2f}x, "
              f"decode {medians['kvattn'][1] / medians['sdpa'][1]:.2f}x, tokens agree: {agree}")
        if not agree:
            print(f"kvattn: {tokens['kvattn'].tolist()}\nsdpa:   {tokens['sdpa'].tolist()}",
                  file=sys.stderr)
        all_agree = all_agree and agree
    kvattn_calls = kvattn_transformers.calls - calls_before
    print(f"attention calls on kvattn: {kvattn_calls}")
    print(f"tokens agree: {all_agree}")
    return 0 if all_agree and kvattn_calls > 0 else 1


if __name__ == "__main__":
    sys.exit(main())

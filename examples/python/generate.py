"""Greedy generation with transformers on kvattn's attention, checked against "sdpa".

A small Llama-architecture model is built from a LlamaConfig with random weights (fixed seed,
nothing downloaded). It generates the same prompt greedily with attn_implementation="kvattn"
and with "sdpa", prints tokens/s of each and whether the tokens agree, and exits 1 if they
do not.

    python examples/python/generate.py [--tokens 32] [--prompt-len 16] [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import kvattn.integrations.transformers as kvattn_transformers  # registers "kvattn"


def build_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, vocab_size=1000,
                         max_position_embeddings=1024)
    return LlamaForCausalLM(config).eval()


def generate(model: LlamaForCausalLM, impl: str, prompt: torch.Tensor, tokens: int
             ) -> tuple[torch.Tensor, float]:
    """Greedy tokens after the prompt, and tokens/s of that generate() call."""
    model.set_attn_implementation(impl)
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens,
                             do_sample=False)
        seconds = time.perf_counter() - start
    return out[:, prompt.shape[1]:], tokens / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = build_model()
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt_len),
                           generator=torch.Generator().manual_seed(1))
    generate(model, "kvattn", prompt, 2)  # warm up both
    generate(model, "sdpa", prompt, 2)
    # Alternate and keep each one's best rate: the machine may be shared.
    calls_before = kvattn_transformers.calls
    ours_rate = theirs_rate = 0.0
    for _ in range(args.repeats):
        ours, rate = generate(model, "kvattn", prompt, args.tokens)
        ours_rate = max(ours_rate, rate)
        theirs, rate = generate(model, "sdpa", prompt, args.tokens)
        theirs_rate = max(theirs_rate, rate)
    kvattn_calls = kvattn_transformers.calls - calls_before

    agree = torch.equal(ours, theirs)
    print(f"kvattn: {ours_rate:8.1f} tokens/s ({kvattn_calls} attention calls on kvattn)")
    print(f"sdpa:   {theirs_rate:8.1f} tokens/s")
    print(f"tokens agree: {agree}")
    if not agree or kvattn_calls == 0:
        print(f"kvattn: {ours.tolist()}\nsdpa:   {theirs.tolist()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Greedy generation with transformers on kvattn's attention, checked against "sdpa".

A small Llama-architecture model is built from a LlamaConfig with random weights (fixed seed,
nothing downloaded). It generates the same prompt greedily with attn_implementation="kvattn"
and with "sdpa", prints tokens/s of each and whether the tokens agree, and exits 1 if they
do not.

    python examples/python/generate.py [--tokens 32] [--prompt-len 16] [--threads 2]
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
    model.set_attn_implementation(impl)
    with torch.inference_mode():
        model.generate(prompt, max_new_tokens=2, min_new_tokens=2, do_sample=False)  # warm up
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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = build_model()
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt_len),
                           generator=torch.Generator().manual_seed(1))
    calls_before = kvattn_transformers.calls
    ours, ours_rate = generate(model, "kvattn", prompt, args.tokens)
    kvattn_calls = kvattn_transformers.calls - calls_before
    theirs, theirs_rate = generate(model, "sdpa", prompt, args.tokens)

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

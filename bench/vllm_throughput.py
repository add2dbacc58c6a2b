#!/usr/bin/env python3
"""vLLM offline throughput, kvattn (attention backend CUSTOM) beside vLLM's own CPU backend, in
one run, alternating: prefill tokens/s at 2k-token prompts and decode tokens/s at batch 16 x 4k
context, bf16 KV and FP8 KV. The model is a random-weight Llama written to a temporary folder
(no download). Not a test: the figures go to the README / notes with the command and the
machine class.

    python bench/vllm_throughput.py [--layers 2 --hidden 512 --heads 8 --kv-heads 2 ...]

Each engine is an offline LLM in its own engine process (vLLM's default), both alive for the
whole run so their measurements interleave (kvattn, vLLM, kvattn, vLLM, ...; an idle engine
waits on its socket). Decode: the 16 prompts are first prefilled once (prefix caching keeps
their blocks), then each repetition serves them again with max_tokens=1 + N; decode tokens/s =
16 * N / (the last request's last-token time - the last first-token time), vLLM's own
per-request timestamps (RequestOutput.metrics). Prefill: each repetition serves new random
2k-token prompts (no cache hits) with max_tokens=1, timed around generate."""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import tempfile
import time
from typing import Any, Dict, List

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def make_model(args: argparse.Namespace, path: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         head_dim=args.hidden // args.heads,
                         max_position_embeddings=args.context + 256,
                         tie_word_embeddings=False, dtype="bfloat16")
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=128, help="vLLM's CPU default")
    p.add_argument("--prefill-len", type=int, default=2048)
    p.add_argument("--prefill-batch", type=int, default=2)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--kv", default="auto,fp8_e4m3",
                   help="cache dtypes: auto (= bf16, the model's) and/or fp8_e4m3, fp8_e5m2")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()

    from vllm import LLM, SamplingParams
    rng = random.Random(0)
    ids = lambda n: [rng.randrange(1, args.vocab) for _ in range(n)]
    tmp = tempfile.mkdtemp(prefix="kvattn-vllm-bench-")
    make_model(args, tmp)
    decode_prompts = [{"prompt_token_ids": ids(args.context)} for _ in range(args.batch)]
    greedy = lambda n: SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True,
                                      detokenize=False)
    rows: List[Dict[str, Any]] = []
    for kv in args.kv.split(","):
        engines: Dict[str, Any] = {}
        for name, backend in (("kvattn", "CUSTOM"), ("vllm-cpu", None)):
            extra = {} if backend is None else {"attention_config": {"backend": backend}}
            try:
                engines[name] = LLM(model=tmp, skip_tokenizer_init=True, dtype="bfloat16",
                                    kv_cache_dtype=kv, block_size=args.block_size,
                                    max_model_len=args.context + args.decode_tokens + 64,
                                    max_num_seqs=args.batch, max_num_batched_tokens=4096,
                                    enable_prefix_caching=True, enforce_eager=True,
                                    kv_cache_memory_bytes=2 << 30, seed=0,
                                    disable_log_stats=False, **extra)
            except Exception as e:  # vLLM's CPU backend refuses FP8 KV without AVX-512/AMX
                print(f"[{kv}] {name}: cannot run: {type(e).__name__}: {str(e)[:300]}")
                rows.append({"kv": kv, "engine": name, "error": f"{type(e).__name__}: {e}"[:300]})
        # Fill each engine's prefix cache with the decode prompts (not timed).
        for llm in engines.values():
            llm.generate(decode_prompts, greedy(1), use_tqdm=False)
        times: Dict[str, Dict[str, List[float]]] = {n: {"prefill": [], "decode": []}
                                                    for n in engines}
        for rep in range(args.reps):
            prefill_prompts = [{"prompt_token_ids": ids(args.prefill_len)}
                               for _ in range(args.prefill_batch)]
            for name, llm in engines.items():
                t0 = time.perf_counter()
                llm.generate(prefill_prompts, greedy(1), use_tqdm=False)
                t1 = time.perf_counter()
                outs = llm.generate(decode_prompts, greedy(1 + args.decode_tokens),
                                    use_tqdm=False)
                first = max(o.metrics.first_token_ts for o in outs)
                last = max(o.metrics.last_token_ts for o in outs)
                times[name]["prefill"].append(args.prefill_batch * args.prefill_len / (t1 - t0))
                times[name]["decode"].append(args.batch * args.decode_tokens / (last - first))
                print(f"[{kv}] rep {rep} {name}: prefill {times[name]['prefill'][-1]:.0f} tok/s, "
                      f"decode {times[name]['decode'][-1]:.1f} tok/s", flush=True)
        for name, t in times.items():
            rows.append({"kv": kv, "engine": name,
                         "prefill_tok_s": statistics.median(t["prefill"]),
                         "decode_tok_s": statistics.median(t["decode"])})
        del engines
        gc.collect()

    shape = (f"random Llama, bf16 weights, {args.layers} layers, hidden {args.hidden}, "
             f"{args.heads}/{args.kv_heads} heads x {args.hidden // args.heads}, MLP "
             f"{args.intermediate}, vocab {args.vocab}; block {args.block_size}; prefill "
             f"{args.prefill_batch} x {args.prefill_len} tokens; decode {args.batch} x "
             f"{args.context} context x {args.decode_tokens} tokens; medians of {args.reps}; "
             f"enforce_eager; torch threads {os.cpu_count()} cores visible")
    print(f"\n{cpu_name()} ({os.cpu_count()} cores)\n{shape}\n")
    print("| KV cache | engine | prefill tok/s | decode tok/s | decode vs vLLM CPU |")
    print("|---|---|---:|---:|---:|")
    base = {r["kv"]: r for r in rows if r["engine"] == "vllm-cpu" and "error" not in r}
    for r in rows:
        kv = "bf16" if r["kv"] == "auto" else r["kv"]
        if "error" in r:
            print(f"| {kv} | {r['engine']} | refused: {r['error'][:80]} | | |")
            continue
        ratio = ""
        if r["kv"] in base:
            ratio = f"{r['decode_tok_s'] / base[r['kv']]['decode_tok_s']:.2f}x"
        print(f"| {kv} | {r['engine']} | {r['prefill_tok_s']:.0f} | {r['decode_tok_s']:.1f} | "
              f"{ratio} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name(), "shape": shape, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

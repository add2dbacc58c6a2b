"""kvattn as a transformers attention implementation ("kvattn"), against transformers' "sdpa".

Models are built from configs with random weights (nothing downloaded). Tested with
transformers 5.24.0."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kvattn.integrations.transformers as kvattn_transformers  # noqa: E402  registers "kvattn"
from transformers import (AutoModelForCausalLM, GenerationConfig, LlamaConfig,  # noqa: E402
                          LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMALL = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)
ARCHS = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


@pytest.fixture(autouse=True)
def _two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(min(threads, 2))
    yield
    torch.set_num_threads(threads)


def make_model(arch: str, dtype=torch.float32):
    config_class, model_class = ARCHS[arch]
    torch.manual_seed(0)
    model = model_class(config_class(**SMALL)).eval()
    return model.to(dtype)


def greedy(model, impl: str, input_ids, tokens: int, **kwargs):
    model.set_attn_implementation(impl)
    with torch.inference_mode():
        out = model.generate(input_ids, max_new_tokens=tokens, min_new_tokens=tokens,
                             do_sample=False, **kwargs)
    return out[:, input_ids.shape[1]:]


def test_registered():
    assert "kvattn" in transformers.AttentionInterface()
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SMALL), attn_implementation="kvattn")
    assert model.config._attn_implementation == "kvattn"
    calls = kvattn_transformers.calls
    with torch.inference_mode():
        model(torch.tensor([[1, 2, 3]]))
    assert kvattn_transformers.calls - calls == SMALL["num_hidden_layers"]


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_greedy_tokens_equal_sdpa(arch):
    model = make_model(arch)
    prompt = torch.randint(0, SMALL["vocab_size"], (1, 12),
                           generator=torch.Generator().manual_seed(1))
    calls = kvattn_transformers.calls
    ours = greedy(model, "kvattn", prompt, 32)
    # Every attention call of generate() ran on kvattn: prefill + 31 decode steps, each layer.
    assert kvattn_transformers.calls - calls == 32 * SMALL["num_hidden_layers"]
    theirs = greedy(model, "sdpa", prompt, 32)
    assert ours.tolist() == theirs.tolist()


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_left_padded_batch_equals_sdpa(arch):
    model = make_model(arch)
    gen = torch.Generator().manual_seed(2)
    short = torch.randint(1, SMALL["vocab_size"], (5,), generator=gen)
    long = torch.randint(1, SMALL["vocab_size"], (11,), generator=gen)
    input_ids = torch.zeros(2, 11, dtype=torch.long)
    attention_mask = torch.zeros(2, 11, dtype=torch.long)
    input_ids[0, 6:], attention_mask[0, 6:] = short, 1
    input_ids[1], attention_mask[1] = long, 1
    calls = kvattn_transformers.calls
    ours = greedy(model, "kvattn", input_ids, 16, attention_mask=attention_mask, pad_token_id=0)
    assert kvattn_transformers.calls - calls == 16 * SMALL["num_hidden_layers"]
    theirs = greedy(model, "sdpa", input_ids, 16, attention_mask=attention_mask, pad_token_id=0)
    assert ours.tolist() == theirs.tolist()
    # Padding is honoured, not merely consistent: the short prompt alone gives the same tokens.
    alone = greedy(model, "kvattn", short[None], 16)
    assert ours[0].tolist() == alone[0].tolist()


def test_sliding_window_left_padded_equals_sdpa():
    """Qwen2 with a 5-token sliding window on every layer: prompts longer than the window,
    left padding, and decode steps past the window."""
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=5,
                                         max_window_layers=0)).eval()
    assert set(model.config.layer_types) == {"sliding_attention"}
    input_ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8, 9, 10], [1, 2, 3, 4, 5, 6, 7, 8, 9]])
    attention_mask = (torch.arange(9) >= torch.tensor([[3], [0]])).long()
    ours = greedy(model, "kvattn", input_ids, 12, attention_mask=attention_mask, pad_token_id=0)
    theirs = greedy(model, "sdpa", input_ids, 12, attention_mask=attention_mask, pad_token_id=0)
    assert ours.tolist() == theirs.tolist()


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_bf16_logits_within_precision(arch):
    """kvattn's bf16 error against an fp32 forward is at most twice sdpa's bf16 error, plus
    one bf16 rounding of the logits' scale."""
    model = make_model(arch)
    prompt = torch.randint(0, SMALL["vocab_size"], (2, 24),
                           generator=torch.Generator().manual_seed(3))

    def logits(impl):
        model.set_attn_implementation(impl)
        with torch.inference_mode():
            return model(prompt).logits.double()

    reference = logits("sdpa")
    model.to(torch.bfloat16)
    calls = kvattn_transformers.calls
    ours = logits("kvattn")
    assert kvattn_transformers.calls - calls == SMALL["num_hidden_layers"]
    theirs = logits("sdpa")
    err_ours = (ours - reference).abs().max().item()
    err_theirs = (theirs - reference).abs().max().item()
    atol = reference.abs().max().item() * 2.0 ** -8
    print(f"bf16 max error vs fp32: kvattn {err_ours:.3g}, sdpa {err_theirs:.3g}, atol {atol:.3g}")
    assert err_ours <= 2 * err_theirs + atol, (err_ours, err_theirs, atol)


@pytest.mark.xfail(raises=ValueError, strict=True, reason=(
    "transformers 5.24: ContinuousBatchingManager.switch_to_cb_friendly_attn "
    "(generation/continuous_batching/continuous_api.py) accepts only 'paged|eager', 'sdpa' or a "
    "name containing 'flash'; no public interface lets a registered implementation serve the "
    "paged cache"))
def test_generate_batch_equals_sdpa():
    model = make_model("llama")
    config = GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=-1, pad_token_id=0)
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8, 9, 10]]
    model.set_attn_implementation("kvattn")
    ours = model.generate_batch(prompts, generation_config=config, warmup=False)
    model.set_attn_implementation("sdpa")
    theirs = model.generate_batch(prompts, generation_config=config, warmup=False)
    assert ({k: v.generated_tokens for k, v in ours.items()}
            == {k: v.generated_tokens for k, v in theirs.items()})


def test_generate_example_runs():
    result = subprocess.run([sys.executable, str(ROOT / "examples/python/generate.py"),
                             "--tokens", "16", "--repeats", "1"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tokens agree: True" in result.stdout

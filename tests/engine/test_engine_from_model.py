"""LLMEngine.from_model and engine/model/random_model.py: serving a model built in memory, without a tokenizer."""
from __future__ import annotations


import pytest
import torch

from loraloom.engine.config import EngineConfig, ModelConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.model.fp8 import Fp8Linear
from loraloom.engine.model.loader import load_model
from loraloom.engine.model.random_model import WEIGHT_STD, random_model
from loraloom.engine.request import SamplingParams

TINY = ModelConfig(
    vocab_size=320, hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
    rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096, tie_word_embeddings=False,
    eos_token_ids=(7,),
)
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def generate(engine: LLMEngine, prompt: list[int], params: SamplingParams = GREEDY) -> tuple[list[int], str]:
    engine.add_request("r", prompt, params)
    tokens, text = [], ""
    while engine.has_unfinished():
        for output in engine.step():
            tokens += output.token_ids
            text += output.text_delta
    return tokens, text


def test_from_model_serves_what_the_checkpoint_engine_serves(tiny_checkpoint) -> None:
    config = EngineConfig(num_kv_blocks=64)
    prompt = [11 + 13 * i % 290 for i in range(40)]
    expected, _ = generate(LLMEngine(tiny_checkpoint, config), prompt)
    model = load_model(tiny_checkpoint, torch.float32, "cpu")
    tokens, text = generate(LLMEngine.from_model(model, config), prompt)
    assert tokens == expected
    assert text == ""  # no tokenizer, no text


def test_without_a_tokenizer_eos_comes_from_the_model_config() -> None:
    engine = LLMEngine.from_model(random_model(TINY, torch.float32, "cpu", seed=0), EngineConfig())
    assert engine.eos_token_ids == (7,)


@pytest.mark.parametrize("params, field", [
    (SamplingParams(stop=["\n"]), "stop"),
    (SamplingParams(logprobs=2), "logprobs"),
])
def test_without_a_tokenizer_text_features_are_refused(params: SamplingParams, field: str) -> None:
    engine = LLMEngine.from_model(random_model(TINY, torch.float32, "cpu", seed=0), EngineConfig())
    with pytest.raises(ValueError, match=f"^{field}: .*this engine has none"):
        engine.add_request("r", [1, 2, 3], params)


def test_from_model_refuses_a_model_of_another_dtype() -> None:
    with pytest.raises(ValueError, match="^model: its weights are torch.float32 on cpu.*dtype='bfloat16'"):
        LLMEngine.from_model(random_model(TINY, torch.float32, "cpu", seed=0), EngineConfig(dtype="bfloat16"))


@pytest.mark.parametrize("terms", [1, 2])
def test_from_model_applies_fp8_quantization(terms) -> None:
    config = EngineConfig(quantization="fp8", fp8_activation_terms=terms)
    engine = LLMEngine.from_model(random_model(TINY, torch.float32, "cpu", seed=0), config)
    layer = engine.runner.model.layers[0]
    for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert isinstance(linear.base, Fp8Linear) and linear.base.two_term_activations == (terms == 2)
    assert len(generate(engine, [1, 2, 3])[0]) == GREEDY.max_tokens


def test_random_model_is_seeded() -> None:
    first, again, other = (random_model(TINY, torch.float32, "cpu", seed=s) for s in (0, 0, 1))
    for (name, a), b, c in zip(first.state_dict().items(), again.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b), name
        if name.endswith("norm.weight"):
            assert torch.equal(a, torch.ones_like(a)), name
        else:
            assert not torch.equal(a, c), name
            assert abs(a.std().item() - WEIGHT_STD) < 0.1 * WEIGHT_STD, name

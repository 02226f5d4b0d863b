"""LLMEngine.validate_request: the checks that need the model (its vocabulary, context length,
tokenizer) raise RequestFieldError naming the field; the sampling fields' ranges are
the API's to check (tests/platform/api/test_sampling_bounds.py), so the engine does not repeat them."""
from __future__ import annotations

import pickle

import pytest
import torch

from loraloom.engine import RequestFieldError
from loraloom.engine.config import EngineConfig, ModelConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.model.random_model import random_model
from loraloom.engine.request import SamplingParams

VOCAB = 320
MAX_MODEL_LEN = 64
TINY = ModelConfig(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
    rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=MAX_MODEL_LEN, tie_word_embeddings=False,
    eos_token_ids=(7,),
)


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine.from_model(random_model(TINY, torch.float32, "cpu", seed=0), EngineConfig(max_model_len=MAX_MODEL_LEN, num_kv_blocks=64))


@pytest.mark.parametrize(
    ("prompt", "params", "field", "says"),
    [
        ([], SamplingParams(), "prompt", "at least one token"),
        ([1, VOCAB], SamplingParams(), "prompt", f"[0, {VOCAB})"),
        ([1] * MAX_MODEL_LEN, SamplingParams(), "prompt", "shorten the prompt"),
        ([1] * 60, SamplingParams(max_tokens=5), "max_tokens", "lower max_tokens to at most 4"),
        ([1, 2], SamplingParams(logit_bias={-1: 1.0}), "logit_bias", "got -1"),
        ([1, 2], SamplingParams(logit_bias={VOCAB: 1.0}), "logit_bias", f"got {VOCAB}"),
        ([1, 2], SamplingParams(stop_token_ids=[VOCAB]), "stop_token_ids", f"[0, {VOCAB})"),
        # max_tokens may be the default, the context the prompt leaves: only the engine knows both.
        ([1, 2], SamplingParams(max_tokens=16, min_tokens=17), "min_tokens", "at most max_tokens (16)"),
    ],
)
def test_what_needs_the_model_is_refused_naming_the_field(engine, prompt, params, field, says):
    with pytest.raises(RequestFieldError) as refused:
        engine.validate_request(prompt, params)
    assert refused.value.field == field and says in refused.value.problem
    assert str(refused.value) == f"{field}: {refused.value.problem}"


def test_what_the_api_bounds_is_not_checked_again(engine):
    """Ranges are the request schema's: the engine takes the edges of OpenAI's ranges and beyond."""
    engine.validate_request([1, 2], SamplingParams(max_tokens=16, min_tokens=16, presence_penalty=-2,
                                                   frequency_penalty=2, logit_bias={5: 100.0}))


def test_the_error_crosses_a_process_boundary_whole():
    """Ray hands a replica's error to the gateway pickled: the field must survive it."""
    error = pickle.loads(pickle.dumps(RequestFieldError("top_p", "must be above 0")))
    assert (type(error), error.field, error.problem) == (RequestFieldError, "top_p", "must be above 0")
    assert isinstance(error, ValueError)

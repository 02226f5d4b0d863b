"""Adapter validation against one tenant hurting others (issue 12): the effective (scaled) weights are
bounded, rank_pattern/alpha_pattern keys are never run as regular expressions, and every malformed
adapter_config.json field is an AdapterLoadError whose `param` names the field."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from lora_factory import make_peft_adapter
from safetensors.torch import load_file, save_file

from loraloom.engine.config import ModelConfig
from loraloom.engine.lora.weights import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    LORA_MODULE_PARENTS,
    MAX_DELTA_NORM,
    MAX_LORA_ENTRY,
    AdapterLoadError,
    inspect_adapter,
    largest_adapter_bytes,
    load_adapter_weights,
)
from loraloom.engine.lora.peft_config import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, parse_peft_config

MAX_RANK = 8
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = Q_A.replace("lora_A", "lora_B")
V_B = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
LOADERS = {"load_adapter_weights": load_adapter_weights, "inspect_adapter": inspect_adapter}


@pytest.fixture(scope="module")
def tiny_config(tiny_llama_dir) -> ModelConfig:
    return ModelConfig.from_dir(tiny_llama_dir)


@pytest.fixture(scope="module")
def pristine(tiny_llama_dir, tmp_path_factory) -> Path:
    """A real PEFT adapter (rank 4, alpha 8 on q/v) for the tiny Llama. Read-only: `edited` copies it."""
    return make_peft_adapter(tiny_llama_dir, tmp_path_factory.mktemp("pristine") / "adapter", rank=4, alpha=8,
                             target_modules=["q_proj", "v_proj"], seed=3)


def edited(pristine: Path, tmp_path: Path, *, config: dict | None = None, tensors=None,
           raw_config: bytes | None = None) -> Path:
    """A copy of the pristine adapter with config fields replaced, tensors edited in place, or the
    config file's bytes replaced outright."""
    directory = Path(shutil.copytree(pristine, tmp_path / "adapter"))
    config_path = directory / ADAPTER_CONFIG_FILE
    if config is not None:
        # json.dumps writes NaN/Infinity as bare NaN/Infinity, as a hostile client would send them.
        config_path.write_text(json.dumps({**json.loads(config_path.read_text()), **config}))
    if raw_config is not None:
        config_path.write_bytes(raw_config)
    if tensors is not None:
        weights = load_file(str(directory / ADAPTER_WEIGHTS_FILE))
        tensors(weights)
        save_file(weights, str(directory / ADAPTER_WEIGHTS_FILE))
    return directory


def refusal(directory: Path, config: ModelConfig, loader=load_adapter_weights) -> AdapterLoadError:
    with pytest.raises(AdapterLoadError) as caught:
        loader(directory, config, MAX_RANK)
    return caught.value


def set_entry(name: str, value: float):
    def edit(tensors):
        tensors[name].view(-1)[0] = value
    return edit


def fill(value: float, dtype: torch.dtype = torch.float32):
    def edit(tensors):
        for name in tensors:
            tensors[name] = torch.full_like(tensors[name], value).to(dtype)
    return edit


def to_dtype(dtype: torch.dtype):
    def edit(tensors):
        tensors.update({name: tensor.to(dtype) for name, tensor in tensors.items()})
    return edit


# ----------------------------------------------------------------------------- item 1: scaled weights
# The finite check used to run before the alpha/r scaling was folded into lora_B, so these all loaded.

@pytest.mark.parametrize("loader", LOADERS.values(), ids=LOADERS.keys())
@pytest.mark.parametrize("changes, param", [
    ({"lora_alpha": math.inf}, "lora_alpha"),
    ({"lora_alpha": -math.inf}, "lora_alpha"),
    ({"lora_alpha": math.nan}, "lora_alpha"),
    ({"lora_alpha": 1e308}, "lora_alpha"),  # finite, but alpha/r x weights overflows float32
    ({"lora_alpha": 1e39}, "lora_alpha"),  # finite as a double, Inf as float32
    ({"lora_alpha": 1e12}, "lora_alpha"),  # finite in float32 too, but a delta no training produces
    ({"lora_alpha": 1e300, "use_rslora": True}, "lora_alpha"),
    ({"alpha_pattern": {"q_proj": math.nan}}, "alpha_pattern"),
    ({"alpha_pattern": {"layers.1.self_attn.v_proj": math.inf}}, "alpha_pattern"),
    ({"alpha_pattern": {"v_proj": 1e30}}, "alpha_pattern"),
], ids=lambda value: json.dumps(value) if isinstance(value, dict) else value)
def test_refuses_alpha_whose_scaled_weights_are_not_finite_or_absurd(pristine, tiny_config, tmp_path, loader,
                                                                     changes, param):
    error = refusal(edited(pristine, tmp_path, config=changes), tiny_config, loader)
    assert error.param == param
    assert param in str(error)


@pytest.mark.parametrize("tensors, name", [
    (set_entry(Q_B, 3e38), Q_B),  # float32 near its max: Inf once scaled by alpha/r = 2
    (set_entry(Q_A, -3.3e38), Q_A),
    (set_entry(V_B, 2 * MAX_LORA_ENTRY), V_B),
    (fill(65504.0, torch.float16), "lora_A"),  # float16's max
], ids=["fp32 B near max", "fp32 A near -max", "B just above the bound", "fp16 at its max"])
def test_refuses_weights_beyond_the_entry_bound(pristine, tiny_config, tmp_path, tensors, name):
    error = refusal(edited(pristine, tmp_path, tensors=tensors), tiny_config)
    assert name in str(error) and f"{MAX_LORA_ENTRY:g}" in str(error)
    assert error.param is None  # the weights are at fault, not a config field


@pytest.mark.parametrize("dtype, alpha", [(torch.float16, 1e6), (torch.bfloat16, 1e30), (torch.float16, 1e308)])
def test_refuses_half_precision_weights_with_a_huge_alpha(pristine, tiny_config, tmp_path, dtype, alpha):
    directory = edited(pristine, tmp_path, config={"lora_alpha": alpha}, tensors=to_dtype(dtype))
    assert refusal(directory, tiny_config).param == "lora_alpha"


def test_refuses_untrained_adapter_with_an_infinite_scaling(pristine, tiny_config, tmp_path):
    """lora_B all zero (PEFT's initialization) x alpha/r of float32 Inf is NaN, not zero."""
    directory = edited(pristine, tmp_path, config={"lora_alpha": 1e300}, tensors=lambda t: [
        t[name].zero_() for name in t if ".lora_B." in name])
    assert refusal(directory, tiny_config).param == "lora_alpha"


def test_refuses_a_delta_too_large_though_each_entry_is_bounded(pristine, tiny_config, tmp_path):
    # A = B = 100 everywhere: every entry is far below the bound, but (B @ A) has entries 4 x 100 x 100 x 2.
    error = refusal(edited(pristine, tmp_path, tensors=fill(100.0)), tiny_config)
    assert "delta" in str(error) and error.param is None
    # A = B = 1: the raw delta is small, an alpha of 4000 (scaling 1000) makes it absurd: alpha is named.
    error = refusal(edited(pristine, tmp_path / "alpha", config={"lora_alpha": 4000}, tensors=fill(1.0)), tiny_config)
    assert "delta" in str(error) and error.param == "lora_alpha"


def test_accepted_adapters_have_bounded_effective_weights(pristine, tiny_config, tmp_path):
    # An untrained adapter (B = 0) with a large but finite scaling changes nothing and is harmless.
    untrained = edited(pristine, tmp_path, config={"lora_alpha": 1e20}, tensors=lambda t: [
        t[name].zero_() for name in t if ".lora_B." in name])
    for directory in (pristine, untrained):
        weights = load_adapter_weights(directory, tiny_config, MAX_RANK)
        for module in weights.modules.values():
            for tensor in (module.lora_a, module.lora_b):
                assert torch.isfinite(tensor).all() and tensor.abs().max() <= MAX_LORA_ENTRY
            assert torch.linalg.matrix_norm(module.lora_b.double() @ module.lora_a.double()) <= MAX_DELTA_NORM
    raw = load_file(str(pristine / ADAPTER_WEIGHTS_FILE))
    torch.testing.assert_close(load_adapter_weights(pristine, tiny_config, MAX_RANK).modules[0, "q_proj"].lora_b,
                               raw[Q_B] * 2.0)


# ----------------------------------------------------------------------------- item 2: pattern keys


def module_names(config: ModelConfig) -> list[str]:
    return [f"model.layers.{layer}.{parent}.{module}"
            for layer in range(config.num_layers) for module, parent in LORA_MODULE_PARENTS.items()]


KEY_SETS = [
    ["q_proj"],
    ["self_attn.q_proj", "mlp.down_proj"],
    ["layers.1.self_attn.q_proj", "q_proj"],  # first match wins: layer 1 gets the first value
    ["q_proj", "layers.1.self_attn.q_proj"],  # ...and here the second key never matches first
    ["model.layers.0.mlp.up_proj", "^model.layers.1.mlp.gate_proj", "^mlp.gate_proj", "1.self_attn.v_proj"],
    ["lm_head", "embed_tokens", "layers.7.self_attn.q_proj", "proj"],  # match nothing: ignored, as by PEFT
]


@pytest.mark.parametrize("keys", KEY_SETS, ids=lambda keys: ",".join(keys))
def test_pattern_keys_resolve_like_peft(tiny_config, keys):
    """PEFT's own matcher (regular expressions, fine for trusted keys) is the oracle for every module."""
    from peft.utils.other import get_pattern_key

    rank_pattern = {key: index + 1 for index, key in enumerate(keys)}
    alpha_pattern = {key: 10.0 * (index + 1) for index, key in enumerate(keys)}
    config = parse_peft_config(json.dumps({"r": 7, "lora_alpha": 3, "rank_pattern": rank_pattern,
                                           "alpha_pattern": alpha_pattern}).encode())
    for name in module_names(tiny_config):
        key = get_pattern_key(keys, name)
        lora = config.module_lora(name)
        assert (lora.rank, lora.alpha) == (rank_pattern.get(key, 7), alpha_pattern.get(key, 3)), name


def test_peft_adapter_with_suffix_and_anchored_keys_loads(tiny_llama_dir, tiny_config, tmp_path):
    """PEFT made the tensors with its own resolution of these keys; the shapes and scalings must agree."""
    rank_pattern = {"layers.1.self_attn.q_proj": 2, "^model.layers.0.mlp.down_proj": 6}
    alpha_pattern = {"model.layers.0.self_attn.q_proj": 24, "down_proj": 3}
    directory = make_peft_adapter(tiny_llama_dir, tmp_path / "adapter", rank=4, alpha=8,
                                  target_modules=["q_proj", "down_proj"], seed=5,
                                  rank_pattern=rank_pattern, alpha_pattern=alpha_pattern)
    raw = load_file(str(directory / ADAPTER_WEIGHTS_FILE))
    weights = load_adapter_weights(directory, tiny_config, MAX_RANK)
    expected = {(0, "q_proj"): (4, 24 / 4), (1, "q_proj"): (2, 8 / 2), (0, "down_proj"): (6, 3 / 6),
                (1, "down_proj"): (4, 3 / 4)}
    for (layer, module), (rank, scaling) in expected.items():
        prefix = f"base_model.model.model.layers.{layer}.{LORA_MODULE_PARENTS[module]}.{module}"
        assert weights.modules[layer, module].lora_a.shape[0] == rank
        torch.testing.assert_close(weights.modules[layer, module].lora_b, raw[f"{prefix}.lora_B.weight"] * scaling)


REFUSED_KEYS = [
    "(",  # gave a 500 (re.error)
    "(.*.*)*=",  # catastrophic backtracking: stalled the server
    "q_proj|v_proj", ".*q_proj", "[qv]_proj", r"layers\.0\.self_attn\.q_proj", "q_proj$", "q_pro.",
    "", ".q_proj", "q_proj.", "layers..q_proj", "^", " q_proj", "q-proj", "layers.*", "q_prój",
]


@pytest.mark.parametrize("field, value", [("rank_pattern", 2), ("alpha_pattern", 16)])
@pytest.mark.parametrize("key", REFUSED_KEYS)
def test_refuses_pattern_keys_that_are_not_module_names(pristine, tiny_config, tmp_path, field, value, key):
    error = refusal(edited(pristine, tmp_path, config={field: {key: value}}), tiny_config)
    assert error.param == field
    message = str(error)
    assert json.dumps(key, ensure_ascii=False) in message  # the key, as written
    assert "'q_proj'" in message and "'layers.3.self_attn.q_proj'" in message  # the accepted forms


def test_catastrophic_key_is_refused_at_once_in_a_fresh_interpreter(pristine, tiny_llama_dir, tmp_path):
    """Run apart so that, were the key a regex again, the test fails on its timeout instead of hanging."""
    directory = edited(pristine, tmp_path, config={"rank_pattern": {"(.*.*)*=": 2, "(a|a)*(b|b)*(c|c)*$": 2}})
    script = textwrap.dedent(f"""
        from loraloom.engine.lora.weights import AdapterLoadError, load_adapter_weights
        from loraloom.engine.config import ModelConfig
        try:
            load_adapter_weights({str(directory)!r}, ModelConfig.from_dir({str(tiny_llama_dir)!r}), 8)
        except AdapterLoadError as error:
            print("refused", error.param)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "refused rank_pattern", result.stderr


# ----------------------------------------------------------------------------- items 10/11: config fields

NESTED_LIST = "[" * 100_000 + "]" * 100_000
NESTED_OBJECT = '{"a": ' * 50_000 + "1" + "}" * 50_000


@pytest.mark.parametrize("changes, param", [
    ({"rank_pattern": ["q_proj", 2]}, "rank_pattern"),  # a list: was an AttributeError (500)
    ({"rank_pattern": "q_proj"}, "rank_pattern"),
    ({"rank_pattern": 4}, "rank_pattern"),
    ({"rank_pattern": {"q_proj": 2.5}}, "rank_pattern"),
    ({"rank_pattern": {"q_proj": "4"}}, "rank_pattern"),
    ({"rank_pattern": {"q_proj": True}}, "rank_pattern"),
    ({"rank_pattern": {"q_proj": 0}}, "rank_pattern"),
    ({"alpha_pattern": {"q_proj": [16]}}, "alpha_pattern"),  # a list value: was a TypeError (500)
    ({"alpha_pattern": {"q_proj": "abc"}}, "alpha_pattern"),  # was "could not convert string to float"
    ({"alpha_pattern": {"q_proj": "16"}}, "alpha_pattern"),
    ({"alpha_pattern": {"q_proj": {"x": 1}}}, "alpha_pattern"),
    ({"alpha_pattern": {"q_proj": False}}, "alpha_pattern"),
    ({"alpha_pattern": {"q_proj": -8}}, "alpha_pattern"),
    ({"alpha_pattern": [["q_proj", 16]]}, "alpha_pattern"),
    ({"lora_alpha": "8"}, "lora_alpha"),
    ({"lora_alpha": True}, "lora_alpha"),
    ({"lora_alpha": None}, "lora_alpha"),
    ({"lora_alpha": 10**400}, "lora_alpha"),  # an int no float can hold: was an OverflowError (500)
    ({"r": True}, "r"),
    ({"r": 4.5}, "r"),
    ({"r": math.nan}, "r"),
    ({"r": "4"}, "r"),
    ({"use_rslora": "false"}, "use_rslora"),  # a non-empty string is truthy: would silently change the scaling
], ids=lambda value: json.dumps(value)[:60] if isinstance(value, dict) else value)
def test_refuses_malformed_config_fields_naming_them(pristine, tiny_config, tmp_path, changes, param):
    error = refusal(edited(pristine, tmp_path, config=changes), tiny_config)
    assert error.param == param
    assert repr(param) in str(error) or f"{param} " in str(error)


@pytest.mark.parametrize("raw, words", [
    ('{"r": 4, "lora_alpha": 8, "note": "café"}'.encode("latin-1"), "UTF-8"),
    ('{"r": 4, "lora_alpha": 8}'.encode("utf-16"), "UTF-8"),
    (b'{"r": 4, "lora_alpha": 8, "x": ' + NESTED_LIST.encode() + b"}", "nested"),
    (NESTED_OBJECT.encode(), "nested"),
    (b'{"r": 1' + b"0" * 5000 + b', "lora_alpha": 8}', "not valid JSON"),  # past int's digit limit: a ValueError
    (b'{"r": 4, "lora_alpha": 8, "x": "' + b"a" * MAX_CONFIG_BYTES + b'"}', f"{MAX_CONFIG_BYTES}"),
    (b"[1, 2]", "JSON object"),
], ids=["latin-1", "utf-16", "nested lists", "nested objects", "huge integer", "too large", "not an object"])
def test_refuses_unreadable_config_files_naming_the_file(pristine, tiny_config, tmp_path, raw, words):
    error = refusal(edited(pristine, tmp_path, raw_config=raw), tiny_config)
    assert error.param == ADAPTER_CONFIG_FILE
    assert words in str(error)


def test_nesting_is_counted_outside_strings_only(pristine, tiny_config, tmp_path):
    brackets = "[{" * (4 * MAX_CONFIG_DEPTH)
    config = json.loads((pristine / ADAPTER_CONFIG_FILE).read_text())
    directory = edited(pristine, tmp_path, config={"note": brackets + '\\"' + brackets,
                                                   "layer_replication": [[0, 1], [1, 2]]})
    assert inspect_adapter(directory, tiny_config, MAX_RANK).alpha == config["lora_alpha"]


def test_largest_adapter_bytes_holds_the_largest_valid_adapter_and_little_more(tiny_llama_dir, tiny_config, tmp_path):
    """The upload cap derived from the base (issue 12 item 13) must never refuse a valid adapter:
    every module at the maximum rank, in float32, fits; and it is a cap, not a wide margin."""
    rank = 16
    adapter = make_peft_adapter(tiny_llama_dir, tmp_path / "widest", rank=rank, alpha=rank,
                                target_modules=sorted(LORA_MODULE_PARENTS), seed=9)
    inspect_adapter(adapter, tiny_config, rank)  # valid for this base at this rank
    size = sum(path.stat().st_size for path in adapter.iterdir() if path.is_file())
    cap = largest_adapter_bytes(tiny_config, rank)
    assert size <= cap < 2 * size + 3 * 1024 * 1024
    assert largest_adapter_bytes(tiny_config, 2 * rank) > cap

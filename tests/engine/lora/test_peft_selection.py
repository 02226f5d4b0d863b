"""PEFT's module selection (target_modules as a list or a regex, layers_to_transform, layers_pattern),
checked against PEFT's own function, and served logits of subset-selecting adapters against PEFT's."""
from __future__ import annotations

import pytest
import torch
from lora_factory import hf_base_model, make_peft_adapter

from loraloom.engine.config import EngineConfig
from loraloom.engine.lora.errors import AdapterLoadError
from loraloom.engine.lora.files import LORA_MODULE_PARENTS
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.lora.peft_selection import parse_module_selection
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.request import SamplingParams

MODULE_NAMES = [f"model.layers.{layer}.{parent}.{module}"
                for layer in range(12) for module, parent in LORA_MODULE_PARENTS.items()]
CONFIGS = [
    dict(target_modules=["q_proj"]),
    dict(target_modules=["self_attn.q_proj", "down_proj"]),
    dict(target_modules=["model.layers.3.self_attn.v_proj"]),
    dict(target_modules=r".*\.(q_proj|v_proj)"),
    dict(target_modules=r"model\.layers\.1[01]\.mlp\..*"),
    dict(target_modules=["q_proj", "v_proj"], layers_to_transform=[0, 10]),
    dict(target_modules=["up_proj"], layers_to_transform=1, layers_pattern="layers"),
    dict(target_modules=["up_proj"], layers_to_transform=[2], layers_pattern=["blocks"]),  # no such list
    dict(target_modules=["o_proj"], layers_to_transform=[]),  # empty: every layer
]


@pytest.mark.parametrize("config", CONFIGS, ids=[str(c) for c in CONFIGS])
def test_selection_is_peft_selection(config):
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    peft_config = LoraConfig(r=4, **config)
    ours = parse_module_selection(config)
    for name in MODULE_NAMES:
        assert ours.selects(name) == bool(check_target_module_exists(peft_config, name)), name


@pytest.mark.parametrize(
    ("config", "field", "says"),
    [
        (dict(target_modules=r"(a+)+$"), "target_modules", "repeats a group"),
        (dict(target_modules="(unclosed"), "target_modules", "not a valid regular expression"),
        (dict(target_modules=[1]), "target_modules", "list of module names"),
        (dict(target_modules=["q_proj"], layers_to_transform=["0"]), "layers_to_transform", "layer index"),
        (dict(target_modules=["q_proj"], layers_to_transform=[0], layers_pattern="model.layers"), "layers_pattern",
         "list of layers"),
        (dict(target_modules=r".*\.q_proj", layers_to_transform=[0]), "layers_to_transform", "regular expression"),
        (dict(target_modules=["q_proj"], layers_pattern="layers"), "layers_pattern", "needs layers_to_transform"),
    ],
)
def test_bad_selection_fields_are_refused_naming_them(config, field, says):
    with pytest.raises(AdapterLoadError, match=says) as refused:
        parse_module_selection(config)
    assert refused.value.param == field


# Subset-selecting adapters as PEFT trains and saves them: each file holds exactly what its config selects.
SUBSET_ADAPTERS = {
    "q-only": dict(rank=4, alpha=8, target_modules=["q_proj"]),
    "first-layer": dict(rank=8, alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], layers_to_transform=[0]),
    "regex": dict(rank=4, alpha=4, target_modules=r".*\.(k_proj|up_proj)"),
    "patterns": dict(rank=8, alpha=8, target_modules=["q_proj", "o_proj", "gate_proj"],
                     rank_pattern={"o_proj": 4}, alpha_pattern={"gate_proj": 32}),
}
STEPS = 6


@pytest.fixture(scope="module")
def subset_adapters(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("subset_adapters")
    return {name: make_peft_adapter(model_dir, root / name, seed=300 + i, init_scale=0.1, **options)
            for i, (name, options) in enumerate(SUBSET_ADAPTERS.items())}


def test_subset_configs_serve_peft_logits(model_dir, subset_adapters):
    """Greedy decode with each adapter: every step's log-probabilities (top 5) equal PEFT's, and differ
    from the base's, so the adapter is applied exactly where PEFT applies it."""
    from peft import PeftModel

    engine = LLMEngine(model_dir, EngineConfig(num_kv_blocks=128, max_loras=4, max_lora_rank=8))
    prompt = engine.tokenizer.encode("The capital of France is", add_special_tokens=True)
    params = SamplingParams(max_tokens=STEPS, temperature=0.0, ignore_eos=True, logprobs=5)
    handles = {name: AdapterHandle(key=f"{name}@selection", name=name, uri=path.as_uri())
               for name, path in subset_adapters.items()}
    for name, handle in [*handles.items(), ("base", None)]:
        engine.add_request(name, prompt, params, handle)
    ours: dict[str, list] = {}
    while engine.has_unfinished():
        for output in engine.step():
            ours.setdefault(output.request_id, []).extend(output.logprobs or [])

    import copy
    for name, path in subset_adapters.items():
        model = PeftModel.from_pretrained(copy.deepcopy(hf_base_model(model_dir.resolve())), path).eval()
        tokens = list(prompt)
        with torch.inference_mode():
            for step, entry in enumerate(ours[name]):
                reference = torch.log_softmax(model(input_ids=torch.tensor([tokens])).logits[0, -1].float(), -1)
                for token_id, _, logprob in entry.top:
                    assert logprob == pytest.approx(reference[token_id].item(), abs=2e-3), (name, step, token_id)
                tokens.append(entry.token_id)
        base_logprobs = [e.logprob for e in ours["base"]]
        assert [e.logprob for e in ours[name]] != pytest.approx(base_logprobs, abs=1e-3), f"{name} changed nothing"

"""benchmarks/served/workload.py's count of the weights a decode step reads, which the served benchmark
prints beside each adapters / base ratio: checked against the tensors of real PEFT adapters of the mix
(written by the benchmark's own write_adapters) and against the bundled model's own parameters."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from served.workload import (adapter_specs, base_linear_weights, lora_weights_per_decode_step,  # noqa: E402
                             parse_subset, write_adapters)


def test_lora_weights_per_step_count_the_adapters_files(model_dir: Path, tmp_path: Path) -> None:
    specs = adapter_specs(3, [3, 40, 7], [parse_subset("k,up"), parse_subset("all"), parse_subset("o,down")])
    write_adapters(model_dir, tmp_path, specs)
    in_files = 0
    for spec in specs:
        with safe_open(str(tmp_path / spec.name / "adapter_model.safetensors"), "pt") as tensors:
            in_files += sum(tensors.get_slice(name).get_shape()[0] * tensors.get_slice(name).get_shape()[1]
                            for name in tensors.keys() if "lora_" in name)
    config = json.loads((model_dir / "config.json").read_text())
    assert lora_weights_per_decode_step(config, specs) == in_files
    assert lora_weights_per_decode_step(config, specs[:1]) < in_files


def test_base_linear_weights_are_the_models_projections_and_lm_head(model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    with safe_open(str(next(model_dir.glob("*.safetensors"))), "pt") as tensors:
        shapes = {name: tensors.get_slice(name).get_shape() for name in tensors.keys()}
    projections = sum(shape[0] * shape[1] for name, shape in shapes.items() if name.endswith("_proj.weight"))
    lm_head = config["vocab_size"] * config["hidden_size"]  # tied: the lm_head reads the embedding
    assert base_linear_weights(config) == projections + lm_head

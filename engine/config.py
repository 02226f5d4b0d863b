"""Model configuration (read from config.json) and engine sizing."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: dict | None = None  # the "llama3" scaling of Llama 3.1, or None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"model: {path} not found; pass a Hugging Face checkpoint directory")
        raw = json.loads(path.read_text())
        arch = raw.get("model_type", "")
        if arch not in ("llama",):
            raise ValueError(f"model: config.json model_type is {arch!r}; only Llama-family ('llama') models are supported")
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        num_heads = raw["num_attention_heads"]
        rope_theta, rope_scaling = _read_rope(raw)
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads", num_heads),
            head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
            rope_theta=rope_theta,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            rope_scaling=rope_scaling,
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


def _read_rope(raw: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from either config.json layout.

    Older configs write `rope_theta` and `rope_scaling` ({"rope_type" or "type", factor, ...});
    transformers 5 writes one `rope_parameters` dict holding rope_theta, rope_type and the
    scaling keys. The scaling dict returned always names its kind under "rope_type", and is
    None for plain ("default") RoPE.
    """
    parameters = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or parameters
    theta = raw.get("rope_theta") or scaling.get("rope_theta") or parameters.get("rope_theta") or 10000.0
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type in (None, "default"):
        return float(theta), None
    extra = {key: value for key, value in scaling.items() if key not in ("rope_theta", "type", "rope_type")}
    return float(theta), {"rope_type": rope_type, **extra}


@dataclass
class EngineConfig:
    block_size: int = 16
    num_kv_blocks: int = 1024
    max_num_seqs: int = 256  # running requests at once
    max_num_batched_tokens: int = 1024  # token budget of one step (prefill chunks + decodes)
    max_model_len: int | None = None  # None = the model's max_position_embeddings, capped at 8192
    max_loras: int = 8  # adapter slots: distinct adapters in one step
    max_lora_rank: int = 64
    enable_prefix_caching: bool = True
    dtype: str = "float32"
    device: str = "cpu"

    def resolved_max_model_len(self, model: ModelConfig) -> int:
        limit = self.max_model_len or min(model.max_position_embeddings, 8192)
        return min(limit, self.num_kv_blocks * self.block_size)

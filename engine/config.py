"""Model configuration (read from config.json) and engine sizing."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from loraloom.engine.generation_defaults import GENERATION_CONFIG_SOURCES


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
    quantization: Fp8CheckpointScheme | None = None  # how an FP8 checkpoint stores its linears; None = unquantized

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
            quantization=_read_quantization(raw),
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


DEFAULT_NUM_KV_BLOCKS = 1024  # the KV pool when num_kv_blocks is None and there is no GPU to plan for


@dataclass(frozen=True)
class Fp8CheckpointScheme:
    """The layout of a pre-quantized FP8 checkpoint (compressed-tensors "float-quantized", as written by
    llm-compressor: the public Llama-3.1-8B-Instruct-FP8 checkpoints). Every q/k/v/o/gate/up/down
    `*.weight` is float8_e4m3fn with a `*.weight_scale`; lm_head stays unquantized."""

    weight_strategy: str  # "channel": weight_scale [out, 1]; "tensor": one scale per weight matrix
    static_input_scale: bool  # True: a calibrated per-tensor `*.input_scale` per linear; False: per token at run time
    kv_cache_scales: bool = False  # a `kv_cache_scheme`: every layer has self_attn.k_scale / v_scale for an FP8 KV cache


def _read_quantization(raw: dict) -> Fp8CheckpointScheme | None:
    """config.json `quantization_config` -> the FP8 scheme, or None for an unquantized checkpoint.

    Anything but symmetric FP8 W8A8 in the compressed-tensors layout is refused, naming the field:
    a misread quantization scheme would serve garbage without any error.
    """
    config = raw.get("quantization_config")
    if config is None:
        if "compression_config" in raw:
            raise ValueError("model: config.json has 'compression_config', the old name of 'quantization_config'; "
                             "rename the key to 'quantization_config'")
        return None

    if config.get("quant_method") != "compressed-tensors":
        raise _refuse("quant_method", config.get("quant_method"), "only 'compressed-tensors' FP8 checkpoints are "
                      "supported; to serve FP8 from a BF16 checkpoint, load the BF16 one with quantization 'fp8'")
    if config.get("format") != "float-quantized":
        raise _refuse("format", config.get("format"), "only 'float-quantized' (float8_e4m3fn weights) is supported")
    groups = config.get("config_groups") or {}
    if len(groups) != 1:
        raise _refuse("config_groups", sorted(groups), "expected exactly one group, targeting ['Linear']")
    name, group = next(iter(groups.items()))
    prefix = f"config_groups.{name}"
    if group.get("targets") != ["Linear"]:
        raise _refuse(f"{prefix}.targets", group.get("targets"), "expected ['Linear']")
    weights = group.get("weights") or {}
    _check_fp8_args(weights, f"{prefix}.weights")
    if weights.get("strategy") not in ("channel", "tensor") or weights.get("dynamic"):
        raise _refuse(f"{prefix}.weights", {key: weights.get(key) for key in ("strategy", "dynamic")},
                      "expected static weight scales per 'channel' or per 'tensor'")
    activations = group.get("input_activations")
    if activations is None:
        raise _refuse(f"{prefix}.input_activations", None, "weight-only FP8 (W8A16) is not supported; use a W8A8 "
                      "checkpoint (FP8 activations too, e.g. an '-FP8-dynamic' one)")
    _check_fp8_args(activations, f"{prefix}.input_activations")
    layout = (activations.get("strategy"), bool(activations.get("dynamic")))
    if layout not in (("token", True), ("tensor", False)):
        raise _refuse(f"{prefix}.input_activations", {"strategy": layout[0], "dynamic": layout[1]},
                      "expected dynamic per-'token' scales or a static per-'tensor' input_scale")
    if group.get("output_activations") is not None:
        raise _refuse(f"{prefix}.output_activations", group["output_activations"],
                      "output quantization is not supported")
    kv_cache_scheme = config.get("kv_cache_scheme")
    if kv_cache_scheme is not None:
        # Static per-tensor FP8 K/V scales (`self_attn.k_scale` / `v_scale`, engine/model/loader.py reads
        # them); they are used when the engine runs with kv_cache_dtype "fp8".
        _check_fp8_args(kv_cache_scheme, "kv_cache_scheme")
        if kv_cache_scheme.get("strategy") != "tensor" or kv_cache_scheme.get("dynamic"):
            raise _refuse("kv_cache_scheme", {key: kv_cache_scheme.get(key) for key in ("strategy", "dynamic")},
                          "expected static per-'tensor' K/V scales (one k_scale and one v_scale per layer)")
    if any(entry != "lm_head" for entry in config.get("ignore") or []):
        raise _refuse("ignore", config["ignore"], "only lm_head may stay unquantized: every q/k/v/o/gate/up/down "
                      "projection must be FP8")
    return Fp8CheckpointScheme(weight_strategy=weights["strategy"], static_input_scale=not layout[1],
                               kv_cache_scales=kv_cache_scheme is not None)


def _refuse(field: str, value: object, fix: str) -> ValueError:
    return ValueError(f"model: config.json quantization_config.{field} is {value!r}; {fix}")


# compressed-tensors QuantizationArgs that must be present, and those whose absence means the default.
_FP8_ARGS_REQUIRED = {"type": "float", "num_bits": 8}
_FP8_ARGS_DEFAULTED = {"symmetric": True, "group_size": None, "block_structure": None}


def _check_fp8_args(args: dict, field: str) -> None:
    """One compressed-tensors QuantizationArgs must describe symmetric, unblocked 8-bit floats."""
    for key, expected in {**_FP8_ARGS_REQUIRED, **_FP8_ARGS_DEFAULTED}.items():
        if args.get(key, _FP8_ARGS_DEFAULTED.get(key)) != expected:
            raise _refuse(f"{field}.{key}", args.get(key),
                          f"expected {expected!r} (symmetric FP8 e4m3, no groups or blocks)")


QUANTIZATION_METHODS = ("fp8",)
FP8_ACTIVATION_TERMS = (1, 2)  # EngineConfig.fp8_activation_terms
KV_CACHE_DTYPES = ("auto", "fp8")  # EngineConfig.kv_cache_dtype
LORA_DTYPES = ("auto", "float32", "bfloat16", "float16")  # EngineConfig.lora_dtype
# EngineConfig.scheduling_policy: "fair" shares the engine across tenants by tokens (engine/fair_share.py);
# "fcfs" admits oldest first whoever asks (the engine before fair share; vLLM's default).
SCHEDULING_POLICIES = ("fair", "fcfs")
# EngineConfig.speculation: "auto" drafts tokens without a draft model and verifies them (engine/speculation/);
# "off" decodes one token per request per step.
SPECULATION_MODES = ("auto", "off")


@dataclass
class EngineConfig:
    block_size: int = 16
    # None = planned at start (engine/memory.py): on CUDA, what gpu_memory_utilization leaves
    # after the weights and the activation peak; elsewhere DEFAULT_NUM_KV_BLOCKS.
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9  # share of the device's total memory the engine may use
    max_num_seqs: int = 256  # running requests at once
    max_num_batched_tokens: int = 1024  # token budget of one step (prefill chunks + decodes)
    max_model_len: int | None = None  # None = the model's max_position_embeddings, capped at 8192
    max_loras: int = 8  # adapter slots: distinct adapters in one step
    max_lora_rank: int = 64
    enable_prefix_caching: bool = True
    dtype: str = "float32"
    device: str = "cpu"
    # "fp8": quantize the q/k/v/o/gate/up/down projections of a BF16 checkpoint at load (FP8 weights
    # per output channel, activations per token); lm_head and the last decoder layer stay in `dtype`
    # (engine/model/fp8.py BF16_LAYERS_AT_LOAD says why). None: serve the checkpoint
    # as stored; a pre-quantized FP8 checkpoint (config.json quantization_config) is FP8 either way.
    quantization: str | None = None
    # With quantization="fp8": each token's activations in this many e4m3 terms. 2 (the second term
    # quantizes the first one's rounding error) keeps the bundled model within 1% of its BF16 perplexity
    # at almost no decode cost but twice the projections' FP8 FLOPs at prefill; 1 is plain W8A8.
    fp8_activation_terms: int = 2
    # "auto": K/V cached in `dtype`; "fp8": in float8_e4m3fn with a K and a V scale per layer (half the
    # bytes of bf16, so twice the tokens fit), from the checkpoint or calibrated at start (engine/model/kv_scales.py).
    kv_cache_dtype: str = "auto"
    # The adapter slot pool's dtype. "auto": `dtype`, so adapters are applied exactly as PEFT applies
    # them to this model; on the CPU a slot keeps an adapter whose weights (PEFT's scale folded in) a
    # 16-bit dtype holds exactly, such as one saved in bfloat16 with alpha = 2r, in that dtype: the same
    # outputs, half the bytes a decode step reads for it. A 16-bit pool on the CPU halves those bytes
    # for every adapter and computes in float32 still; the weights are rounded to it once, at load.
    # The Triton kernels compute LoRA in `dtype`, so on CUDA it must be "auto" or `dtype`.
    lora_dtype: str = "auto"
    # On CUDA, decode steps replay CUDA graphs (engine/cuda_graphs.py); True runs every step eagerly
    # (for debugging, or to save the graphs' capture time and memory).
    enforce_eager: bool = False
    # How waiting requests are admitted across tenants (SCHEDULING_POLICIES; engine/scheduler.py). With one
    # tenant both are oldest first.
    scheduling_policy: str = "fair"
    # Adapters ((tenant, adapter) pairs) whose requests get metric labels of their own; later ones are
    # counted under model "other" (engine/metric_labels.py), which bounds the metrics' series.
    metrics_max_adapters: int = 100
    # Where omitted sampling fields come from (engine/generation_defaults.py): "auto", the model's
    # generation_config.json, as vLLM does; "none", the server's built-in defaults (temperature 1).
    generation_config: str = "auto"
    # Speculative decoding (SPECULATION_MODES; engine/speculation/): "auto" proposes tokens from the request's
    # own prompt and output and from its adapter's recent answers, verifies them in the request's next
    # forward with its own adapter, and stops proposing for requests whose proposals keep failing.
    speculation: str = "auto"
    # The most proposed tokens one request verifies in one step.
    speculative_max_tokens: int = 6

    def __post_init__(self) -> None:
        if self.speculation not in SPECULATION_MODES:
            raise ValueError(f"EngineConfig.speculation is {self.speculation!r}; use one of {list(SPECULATION_MODES)}")
        if not 1 <= self.speculative_max_tokens <= 32:
            raise ValueError(f"EngineConfig.speculative_max_tokens is {self.speculative_max_tokens}; use 1 to 32")
        if self.metrics_max_adapters < 0:
            raise ValueError(f"EngineConfig.metrics_max_adapters is {self.metrics_max_adapters}; use 0 or more")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"EngineConfig.scheduling_policy is {self.scheduling_policy!r}; "
                             f"use one of {list(SCHEDULING_POLICIES)}")
        if self.quantization is not None and self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(f"EngineConfig.quantization is {self.quantization!r}; "
                             f"use None or one of {list(QUANTIZATION_METHODS)}")
        if self.fp8_activation_terms not in FP8_ACTIVATION_TERMS:
            raise ValueError(f"EngineConfig.fp8_activation_terms is {self.fp8_activation_terms!r}; "
                             f"use one of {list(FP8_ACTIVATION_TERMS)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"EngineConfig.kv_cache_dtype is {self.kv_cache_dtype!r}; use one of {list(KV_CACHE_DTYPES)}")
        if self.generation_config not in GENERATION_CONFIG_SOURCES:
            raise ValueError(f"EngineConfig.generation_config is {self.generation_config!r}; "
                             f"use one of {list(GENERATION_CONFIG_SOURCES)}")
        if self.lora_dtype not in LORA_DTYPES:
            raise ValueError(f"EngineConfig.lora_dtype is {self.lora_dtype!r}; use one of {list(LORA_DTYPES)}")
        if self.resolved_lora_dtype != self.dtype and not self.device.startswith("cpu"):
            raise ValueError(f"EngineConfig.lora_dtype is {self.lora_dtype!r} on {self.device}, where LoRA is "
                             f"computed in the model's dtype ({self.dtype!r}); use 'auto'")

    @property
    def resolved_lora_dtype(self) -> str:
        return self.dtype if self.lora_dtype == "auto" else self.lora_dtype

    def context_limit(self, model: ModelConfig) -> int:
        """The longest context served before the KV cache's size is known (it may lower it further)."""
        return self.max_model_len or min(model.max_position_embeddings, 8192)

    def resolved_max_model_len(self, model: ModelConfig) -> int:
        if self.num_kv_blocks is None:
            raise ValueError("num_kv_blocks: not planned yet; resolve it with engine/memory.py plan_memory first")
        return min(self.context_limit(model), self.num_kv_blocks * self.block_size)

"""The KV cache's dtype, and the per-layer K/V scales an FP8 cache needs (kernels/kv_quant.py).

`EngineConfig.kv_cache_dtype` "auto" keeps K/V in the activation dtype; "fp8" stores them as
float8_e4m3fn, half the bytes of bf16, with one fp32 scale for K and one for V per layer
(`LlamaAttention.k_scale` / `.v_scale`). The scales come from, in order:

1. the checkpoint: `model.layers.{i}.self_attn.k_scale` / `.v_scale`, as llm-compressor writes them
   for compressed-tensors checkpoints with a `kv_cache_scheme` (engine/model/loader.py reads them);
2. otherwise a calibration forward at start (`calibrate_kv_scales`): one prefill of
   CALIBRATION_TOKENS tokens (a built-in English text when the engine has a tokenizer, then
   random ids) through a cache in the activation dtype, and each layer's scale from the largest
   |K| / |V| it wrote, with kernels/kv_quant.py's headroom.

A scale of 1.0 is never used silently: it clips any |K| above 448 (Llama's K reaches hundreds in
some heads) and sends small V values into e4m3's subnormal range.
"""
from __future__ import annotations

import logging

import torch

from loraloom.engine.config import EngineConfig, ModelConfig
from loraloom.engine.model.llama import LlamaModel, allocate_kv_cache
from loraloom.engine.tokenizer import Tokenizer
from loraloom.kernels.dtypes import FP8_DTYPE
from loraloom.kernels.kv_quant import scale_for_amax
from loraloom.kernels.metadata import AttentionMetadata

logger = logging.getLogger(__name__)

CALIBRATION_TOKENS = 512
CALIBRATION_BLOCK_SIZE = 16
CALIBRATION_SEED = 0
# Ordinary prose of several registers (narrative, technical, numbers, code-like text, dialogue), so
# that the calibration sees the activations of real text, not only those of random token ids.
CALIBRATION_TEXT = (
    "The river had been rising for three days when the ferry stopped running. People on the east bank "
    "carried sandbags from the school to the bakery, and nobody complained about the rain anymore. "
    "To configure the server, set the port to 8080, enable TLS, and restart the service; the logs are "
    "written to /var/log/app.log every 60 seconds. In 1969, 600 million people watched the landing. "
    "\"Are you coming tomorrow?\" she asked. \"Only if the train is on time,\" he said, and laughed. "
    "def area(radius): return 3.14159 * radius ** 2  # the area of a circle. Photosynthesis converts "
    "light, water and carbon dioxide into glucose and oxygen. The committee approved the budget of "
    "$4.2 million by a vote of seven to two, after a long debate about the new library."
)


def kv_cache_torch_dtype(config: EngineConfig) -> torch.dtype:
    """The dtype the KV cache is allocated in: float8_e4m3fn for "fp8", else the activation dtype."""
    return FP8_DTYPE if config.kv_cache_dtype == "fp8" else getattr(torch, config.dtype)


def prepare_kv_scales(model: LlamaModel, config: EngineConfig, tokenizer: Tokenizer | None) -> str | None:
    """Make sure an FP8 cache has its scales; return where they came from ("checkpoint" or "calibrated"),
    or None for a cache in the activation dtype (no scales used)."""
    if config.kv_cache_dtype != "fp8":
        return None
    if model.kv_scales_from_checkpoint:
        source = "checkpoint"
    else:
        calibrate_kv_scales(model, calibration_tokens(model, tokenizer))
        source = "calibrated"
    scales = [(layer.self_attn.k_scale.item(), layer.self_attn.v_scale.item()) for layer in model.layers]
    logger.info("FP8 KV cache: per-layer scales %s, K %.3g..%.3g, V %.3g..%.3g", source,
                min(k for k, _ in scales), max(k for k, _ in scales), min(v for _, v in scales),
                max(v for _, v in scales))
    return source


def calibration_tokens(model: LlamaModel, tokenizer: Tokenizer | None) -> list[int]:
    """BOS (if the model has one), CALIBRATION_TEXT (with a tokenizer), then seeded random ids, to CALIBRATION_TOKENS."""
    config = model.config
    tokens = [] if config.bos_token_id is None else [config.bos_token_id]
    if tokenizer is not None:
        tokens += tokenizer.encode(CALIBRATION_TEXT, add_special_tokens=False)
    generator = torch.Generator().manual_seed(CALIBRATION_SEED)
    filler = CALIBRATION_TOKENS - len(tokens)
    tokens += torch.randint(0, config.vocab_size, (max(0, filler),), generator=generator).tolist()
    return tokens[:CALIBRATION_TOKENS]


@torch.inference_mode()
def calibrate_kv_scales(model: LlamaModel, tokens: list[int]) -> None:
    """Set every layer's k_scale / v_scale from one prefill of `tokens` (kernels/kv_quant.py scale_for_amax).

    The prefill writes through a zeroed cache in the activation dtype (the model's own kernels,
    rotary included, so K is measured after rotation, as it is stored), and the largest |value|
    in each layer's cache is the largest the prefill wrote.
    """
    weight = model.embed_tokens.weight
    device, dtype = weight.device, weight.dtype
    count = len(tokens)
    num_blocks = -(-count // CALIBRATION_BLOCK_SIZE)
    caches = allocate_kv_cache(model.config, num_blocks, CALIBRATION_BLOCK_SIZE, dtype, device)
    attn = AttentionMetadata(
        query_start_loc=torch.tensor([0, count], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([count], dtype=torch.int32, device=device),
        block_tables=torch.arange(num_blocks, dtype=torch.int32, device=device)[None],
        slot_mapping=torch.arange(count, device=device),
        query_start_loc_host=[0, count],
        seq_lens_host=[count],
    )
    ids = torch.tensor(tokens, dtype=torch.int64, device=device)
    model(ids, torch.arange(count, device=device), caches, attn, None)
    for layer, (k_cache, v_cache) in zip(model.layers, caches):
        layer.self_attn.k_scale.copy_(scale_for_amax(k_cache.abs().amax().reshape(1)))
        layer.self_attn.v_scale.copy_(scale_for_amax(v_cache.abs().amax().reshape(1)))


# ------------------------------------------------------------------ checkpoint scales
KV_SCALE_NAMES = ("self_attn.k_scale", "self_attn.v_scale")  # LlamaAttention's buffers, per layer
# Hugging Face names per layer -> ours: llm-compressor's, and the older AutoFP8 exports' output scales.
_CHECKPOINT_KV_SCALE_NAMES = {
    "self_attn.k_scale": ("self_attn.k_scale", "self_attn.k_proj.output_scale"),
    "self_attn.v_scale": ("self_attn.v_scale", "self_attn.v_proj.output_scale"),
}


def take_kv_cache_scales(tensors: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Pop a checkpoint's FP8 KV cache scales out of `tensors` (Hugging Face names); return them as
    `layers.{i}.self_attn.k_scale` / `v_scale`, [1] fp32 each, or {} when the checkpoint has none.

    All or nothing: every layer's K and V scale, each one positive finite value. A checkpoint whose
    config.json declares a kv_cache_scheme must have them.
    """
    scales: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    for i in range(config.num_layers):
        for ours, candidates in _CHECKPOINT_KV_SCALE_NAMES.items():
            names = [name for name in (f"model.layers.{i}.{candidate}" for candidate in candidates) if name in tensors]
            if not names:
                missing.append(f"model.layers.{i}.{candidates[0]}")
                continue
            if len(names) > 1:
                raise ValueError(f"loader: the checkpoint has both {names[0]!r} and {names[1]!r}; "
                                 "keep one K/V scale per layer")
            scale = tensors.pop(names[0]).float()
            if scale.numel() != 1 or not bool(torch.isfinite(scale).all() and (scale > 0).all()):
                raise ValueError(f"loader: tensor {names[0]!r} must hold one positive finite FP8 KV cache scale; "
                                 f"got shape {list(scale.shape)}")
            scales[f"layers.{i}.{ours}"] = scale.reshape(1)
    declared = config.quantization is not None and config.quantization.kv_cache_scales
    if missing and (scales or declared):
        raise ValueError(f"loader: the checkpoint lacks tensor {missing[0]!r}; FP8 KV cache scales must be given for "
                         "every layer's K and V (or, without config.json kv_cache_scheme, for none)")
    return scales


def set_kv_cache_scales(model: LlamaModel, scales: dict[str, torch.Tensor]) -> None:
    """Copy take_kv_cache_scales' output into the model's buffers and mark them as the checkpoint's."""
    for name, value in scales.items():
        model.get_buffer(name).copy_(value)
    model.kv_scales_from_checkpoint = True

"""FP8 W8A8 base model: the FP8 linear module, quantization at load, and FP8 checkpoint scales.

The four projections of the decoder layers (qkv_proj, o_proj, gate_up_proj, down_proj: the
q/k/v/o/gate/up/down linears, fused) become `Fp8Linear`s, replaced by name like LoRA's wrappers,
so the Llama forward (engine/model/llama.py) stays FP8-free. Embedding, norms and lm_head stay in the
model dtype: lm_head is the most quantization-sensitive matmul and the logits feed sampling.

Two sources of FP8 weights:
- a BF16 checkpoint quantized at load (`quantize_model_fp8`): one scale per output channel, activations
  per token in two e4m3 terms, the last decoder layer left in BF16 (see BF16_LAYERS_AT_LOAD for why);
- a pre-quantized compressed-tensors checkpoint (engine/config.py `Fp8CheckpointScheme`):
  `*.weight` in float8_e4m3fn with `*.weight_scale` per channel [out, 1] or per tensor, and
  `*.input_scale` when activations are statically quantized. Per-tensor scales are expanded to
  per-channel on load, which represents them exactly and lets fused q/k/v keep their own. Its
  activations are quantized as the checkpoint declares (one e4m3 term per token, or static).
"""
from __future__ import annotations

from collections.abc import Callable, Collection

import torch
from torch import nn

from loraloom.engine.config import ModelConfig
from loraloom.engine.model.layers import Linear
from loraloom.engine.model.llama import PACKED_MODULES
from loraloom.kernels.backend import REFERENCE_BACKEND, KernelBackend
from loraloom.kernels.dtypes import FP8_DTYPE
from loraloom.kernels.fp8 import quantize_weight_per_channel
from loraloom.kernels.metadata import SGMVMetadata


class Fp8Linear(Linear):
    """A Linear whose weight [out, in] is float8_e4m3fn with an fp32 scale per output channel.

    It keeps Linear's interface (in_features, slice_sizes, out_features, forward(x, lora)), so
    LoRALinear wraps it unchanged: the adapter's delta is added in the activation dtype on top
    of the FP8 base output. Activations are quantized per token at each call, or with the
    checkpoint's static `input_scale` when it has one. The product runs in the backend's
    fp8_linear (kernels/fp8.py: Triton kernels, `_scaled_mm` or the reference).
    """

    plain_weight = False  # the product needs the scales: LoRALinear adds the adapters after it

    def __init__(
        self, in_features: int, slice_sizes: tuple[int, ...], static_input_scale: bool, device: torch.device | str,
        two_term_activations: bool = False, backend: KernelBackend = REFERENCE_BACKEND,
    ):
        super().__init__(in_features, slice_sizes, FP8_DTYPE, device, backend)
        if two_term_activations and static_input_scale:
            raise ValueError("Fp8Linear: two-term activations are quantized per token; they exclude a static "
                             "input_scale")
        self.two_term_activations = two_term_activations
        self.weight_scale = nn.Parameter(
            torch.ones(self.out_features, 1, dtype=torch.float32, device=device), requires_grad=False
        )
        input_scale = nn.Parameter(torch.ones(1, dtype=torch.float32, device=device), requires_grad=False)
        self.register_parameter("input_scale", input_scale if static_input_scale else None)

    @classmethod
    def from_linear(cls, linear: Linear, two_term_activations: bool = False,
                    backend: KernelBackend = REFERENCE_BACKEND) -> "Fp8Linear":
        """`linear`'s weight quantized per output channel (activations will be quantized per token, in
        two e4m3 terms if `two_term_activations`)."""
        fp8 = cls(linear.in_features, linear.slice_sizes, static_input_scale=False, device=linear.weight.device,
                  two_term_activations=two_term_activations, backend=backend)
        weight_q, weight_scale = quantize_weight_per_channel(linear.weight)
        fp8.weight.copy_(weight_q)
        fp8.weight_scale.copy_(weight_scale)
        return fp8

    def forward(self, x: torch.Tensor, lora: SGMVMetadata | None) -> torch.Tensor:  # [T, in] -> [T, out]
        return self.backend.fp8_linear(x, self.weight, self.weight_scale, self.input_scale, self.two_term_activations)

    def extra_repr(self) -> str:
        activations = "static per-tensor" if self.input_scale is not None else "dynamic per-token"
        if self.two_term_activations:
            activations += " two-term"
        return f"{super().extra_repr()}, fp8 e4m3 weights per channel, {activations} activation scales"


# The recipe for quantizing at load: every projection's weight in e4m3 per output channel, except the
# decoder layers of BF16_LAYERS_AT_LOAD (negative: from the end), which keep the model dtype, and every
# FP8 projection's activations quantized per token in TWO e4m3 terms (x ~ s1*q1 + s2*q2, q2 the rounding
# residual of q1; kernels/fp8.py quantize_per_token_two_term).
#
# Measured on the bundled SmolLM2-135M in bf16, the real path (kernels/reference.py), perplexity ratio
# FP8 / BF16 on the first 4,096 tokens of tests/engine/model/test_fp8_model.py's held-out text (BF16 13.260):
#   all FP8 (one-term)                          x1.036   weights only FP8 (acts BF16)     x1.0235
#   activations only FP8 (weights BF16)         x1.023   weights only FP8, last layer BF16 x1.0093
#   activations only FP8, last layer BF16       x1.022   one-term, last layer BF16         x1.019
#   two-term everywhere, all layers FP8         x1.024   two-term, last layer BF16         x1.0087
#   two-term, last layer's MLP only BF16        x1.0088  two-term, last two layers BF16    x1.0092
#   one-term but two-term on down_proj only, last layer BF16                               x1.020
# So the error has two halves of about equal size and different shape. The weights' half sits mostly in
# the last layer (it writes straight into the final norm and lm_head; no later layer dilutes its errors):
# keeping that layer in BF16 takes weights-only from x1.0235 to x1.009, more layers add nothing. The
# activations' half is spread over all layers and module types (BF16 for the last layer, or two terms on
# down_proj alone, leave it at ~x1.02), and is e4m3's 3-bit mantissa itself: per-token rounding moves
# an input by ~2.3% of its norm whatever the scale granularity, so scale tricks cannot remove it
# (SmoothQuant a = 0.5 x1.021 and per-group(128) scales no better, earlier, 20k tokens); the residual
# term cuts it ~16x, which leaves the weights-only floor. On 20,480 tokens of the test's text (BF16 16.024) the
# recipe gives x1.0001 (one-term with the last layer BF16 was x1.0126 there, all one-term FP8 x1.026).
# Noise: the real path and an fp32 fake-quant emulation of the same one-term recipe (equal up to fp32
# summation order; no extra bf16 rounding on either: both round the fp32 product to bf16 once) differ
# by 0.5% on 4k tokens: a last-bit change flips e4m3 rounding decisions downstream, so single
# comparisons closer than ~0.3% mean nothing. Two-term activations also shrink that noise.
#
# The price on an 8B H100 step: the BF16 layer's projections, +1/num_layers of the FP8 weight bytes
# (~3% of a decode step). Two-term activations double the rows of each FP8 GEMM: at decode the weight
# read is the cost and the extra rows ride in the same (16-row padded) tile, ~free; at prefill the
# projections' FP8 FLOPs double, i.e. BF16-like tensor-core time for the GEMMs.
BF16_LAYERS_AT_LOAD: tuple[int, ...] = (-1,)
TWO_TERM_ACTIVATIONS_AT_LOAD = True  # EngineConfig.fp8_activation_terms (default 2) chooses per engine


def quantize_model_fp8(
    model: nn.Module,
    bf16_layers: tuple[int, ...] = BF16_LAYERS_AT_LOAD,
    two_term_activations: bool = TWO_TERM_ACTIVATIONS_AT_LOAD,
) -> None:
    """Quantize the projections of the decoder layers of a loaded model to FP8, in place, except those of
    `bf16_layers` (indices into model.layers, negative from the end), which keep the model dtype; their
    activations are quantized per token, in two e4m3 terms if `two_term_activations`. The FP8 linears
    run on the model's kernel backend."""
    count = len(model.layers)
    for index in bf16_layers:
        if not -count <= index < count:
            raise ValueError(f"fp8: bf16_layers holds layer {index}, but the model has {count} layers "
                             f"(valid indices {-count}..{count - 1})")
    keep = {index % count for index in bf16_layers}
    _replace_projections(model, lambda linear: Fp8Linear.from_linear(linear, two_term_activations, model.backend),
                         skip=keep)


def use_fp8_linears(model: nn.Module, static_input_scale: bool) -> None:
    """Swap the projections for uninitialized Fp8Linears, to be filled by load_state_dict from an FP8 checkpoint."""
    _replace_projections(
        model,
        lambda linear: Fp8Linear(linear.in_features, linear.slice_sizes, static_input_scale, linear.weight.device,
                                 backend=model.backend),
    )


def _replace_projections(model: nn.Module, make: Callable[[Linear], Fp8Linear], skip: Collection[int] = ()) -> None:
    for index, layer in enumerate(model.layers):
        if index in skip:
            continue
        for path in PACKED_MODULES:
            block_name, linear_name = path.split(".")
            block = getattr(layer, block_name)
            linear = getattr(block, linear_name)
            if type(linear) is not Linear:
                raise TypeError(f"fp8: layers[{index}].{path} is a {type(linear).__name__}, not a base Linear; "
                                "convert a freshly loaded model once, before attach_lora")
            setattr(block, linear_name, make(linear))


def take_fp8_scales(tensors: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Check an FP8 checkpoint's projections and pop their scales out of `tensors` (Hugging Face names).

    Returns the scales under LlamaModel's parameter names, fused like the weights:
    `layers.{i}.{projection}.weight_scale` [out, 1] fp32 (the parts' per-channel scales concatenated)
    and, for static activations, `layers.{i}.{projection}.input_scale` [1] fp32 (the largest of the
    parts': q/k/v, and gate/up, read the same input, and the largest scale clips none of them).
    """
    scheme = config.quantization
    if scheme is None:
        raise ValueError("fp8: config.json has no quantization_config; this is not an FP8 checkpoint")
    if "lm_head.weight_scale" in tensors:
        raise ValueError("loader: the checkpoint quantizes lm_head ('lm_head.weight_scale'); only checkpoints that "
                         "keep lm_head unquantized (quantization_config.ignore = ['lm_head']) are supported")
    scales: dict[str, torch.Tensor] = {}
    projections: set[str] = set()
    for i in range(config.num_layers):
        for path, parts in PACKED_MODULES.items():
            block = path.split(".")[0]
            names = [f"model.layers.{i}.{block}.{part}" for part in parts]
            projections.update(f"{name}.weight" for name in names)
            weight_scales = [_take_weight_scale(tensors, name, scheme.weight_strategy) for name in names]
            scales[f"layers.{i}.{path}.weight_scale"] = torch.cat(weight_scales)
            input_scales = [_take_input_scale(tensors, name, scheme.static_input_scale) for name in names]
            if scheme.static_input_scale:
                scales[f"layers.{i}.{path}.input_scale"] = torch.stack(input_scales).amax(dim=0)
    stray = [name for name, tensor in tensors.items() if tensor.dtype == FP8_DTYPE and name not in projections]
    if stray:
        raise ValueError(f"loader: tensor '{stray[0]}' is FP8 but is not a q/k/v/o/gate/up/down weight; only those "
                         "projections may be quantized (embeddings, norms and lm_head must be unquantized)")
    return scales


def _take_weight_scale(tensors: dict[str, torch.Tensor], module: str, strategy: str) -> torch.Tensor:
    """module's weight_scale as [out, 1] fp32, after checking the weight is FP8 and the scale fits `strategy`."""
    weight = tensors.get(f"{module}.weight")
    if weight is None:
        raise ValueError(f"loader: the checkpoint lacks tensor '{module}.weight'; the checkpoint is incomplete")
    if weight.dtype != FP8_DTYPE:
        raise ValueError(f"loader: tensor '{module}.weight' has dtype {weight.dtype} but quantization_config declares "
                         "FP8 weights; expected float8_e4m3fn (re-export the checkpoint, or drop quantization_config)")
    scale = _pop_scale(tensors, f"{module}.weight_scale", "the checkpoint is not an FP8 W8A8 export")
    rows = weight.shape[0]
    if strategy == "channel" and tuple(scale.shape) != (rows, 1):
        raise ValueError(f"loader: tensor '{module}.weight_scale' has shape {list(scale.shape)}, but per-channel "
                         f"scales (quantization_config weights.strategy 'channel') must be [{rows}, 1]")
    if strategy == "tensor" and scale.numel() != 1:
        raise ValueError(f"loader: tensor '{module}.weight_scale' has shape {list(scale.shape)}, but a per-tensor "
                         "scale (quantization_config weights.strategy 'tensor') must hold one value")
    return scale.reshape(-1, 1).expand(rows, 1)


def _take_input_scale(tensors: dict[str, torch.Tensor], module: str, static: bool) -> torch.Tensor | None:
    name = f"{module}.input_scale"
    if not static:
        if name in tensors:
            raise ValueError(f"loader: the checkpoint has '{name}', but quantization_config declares dynamic "
                             "activation scales; the config does not match the weights")
        return None
    scale = _pop_scale(tensors, name, "static activations (input_activations.dynamic false) need one per linear")
    if scale.numel() != 1:
        raise ValueError(f"loader: tensor '{name}' has shape {list(scale.shape)}; a static activation scale "
                         "must hold one value")
    return scale.reshape(1)


def _pop_scale(tensors: dict[str, torch.Tensor], name: str, reason: str) -> torch.Tensor:
    if name not in tensors:
        raise ValueError(f"loader: the checkpoint lacks tensor '{name}'; {reason}")
    scale = tensors.pop(name).float()
    if not (torch.isfinite(scale).all() and (scale > 0).all()):
        raise ValueError(f"loader: tensor '{name}' holds a scale that is not a positive finite number")
    return scale

"""Host-side LoRA adapter weights: read a PEFT directory, validate it against the base, fold the scaling.

Everything is checked before a single tensor is used, so a bad upload fails at
load time with a message naming the module and the shapes, instead of a shape
error in the middle of a step or a silently skipped module. The ways real adapters
go wrong are each refused by name: modules_to_save, embedding/lm_head weights, ranks
above the max, another base model.
adapter_config.json is read and checked by engine/lora/peft_config.py. The weights
are checked as the engine will use them, after the scaling is folded in: one
tenant's adapter that is finite only before scaling would put Inf/NaN into a
shared GPU slot (issue 12).
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import SafetensorError, safe_open

# AdapterLoadError is also imported from here by the engine's LoRA layers.
from loraloom.engine.lora.errors import AdapterLoadError
from loraloom.engine.config import ModelConfig
from loraloom.engine.lora.files import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, LORA_MODULE_PARENTS
from loraloom.engine.lora.peft_config import MAX_CONFIG_BYTES, ModuleLoRA, PeftLoRAConfig, read_peft_config
from loraloom.engine.lora.peft_selection import ModuleSelection

# Pickle checkpoints that PEFT or torch may have written; never unpickled: unpickling a tenant's upload
# would run whatever code it holds.
PICKLE_WEIGHTS_FILES = ("adapter_model.bin", "adapter_model.pt", "adapter_model.pth")
ACCEPTED_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}
# The 16-bit dtypes an adapter's weights may fit exactly (AdapterWeights.exact_dtype), bfloat16 first: it
# also holds float32's exponent range.
HALF_DTYPES = (torch.bfloat16, torch.float16)

# PEFT's tensor names: base_model.model.<HF module name>.lora_{A|B}[.<adapter name>].weight
_TENSOR_NAME = re.compile(r"base_model\.model\.(model\.layers\.(\d+)\.(\w+)\.(\w+))\.lora_([AB])(?:\.\w+)?\.weight")
_BASE_ONLY_MODULES = ("embed_tokens", "lm_head")

# Bounds on what an adapter adds to a base weight, checked on lora_A and on lora_B with the scaling folded
# in: exactly what the engine multiplies activations by. A trained LoRA is a small correction. PEFT starts
# from A ~ U(+-1/sqrt(in)) and B = 0 and training moves them in small steps, so entries stay well below 1,
# and the delta B @ A has a Frobenius norm at most of the order of the base weight's own (tens for Llama
# projections). 1e4 is orders of magnitude above all of that, so no real adapter reaches it, while it refuses
# what only corruption or malice produces: float32 entries near 3e38, an alpha of 1e308, a delta that would
# swamp the base output and overflow half-precision activations.
MAX_LORA_ENTRY = 1e4  # |entry| of lora_A and of scaled lora_B
MAX_DELTA_NORM = 1e4  # Frobenius norm of scaled lora_B @ lora_A


class ModulePlan(NamedTuple):
    """One module whose tensor headers passed every check: what to read and how to scale it."""

    hf_name: str  # e.g. "model.layers.3.self_attn.q_proj"
    tensor_names: dict[str, str]  # "A" | "B" -> tensor name in the safetensors file
    lora: ModuleLoRA


class ModuleShape(NamedTuple):
    in_features: int
    out_features: int


@dataclass(frozen=True)
class LoRAModuleWeights:
    lora_a: torch.Tensor  # [r, in_features] float32
    lora_b: torch.Tensor  # [out_features, r] float32, PEFT's scaling folded in


@dataclass(frozen=True)
class AdapterWeights:
    rank: int  # the largest module rank: what a GPU slot must hold
    modules: dict[tuple[int, str], LoRAModuleWeights]  # (layer index, module name such as "q_proj")

    @property
    def target_modules(self) -> frozenset[str]:
        return frozenset(name for _, name in self.modules)

    @functools.cached_property
    def exact_dtype(self) -> torch.dtype:
        """The narrowest dtype that holds every weight (PEFT's scaling folded in) exactly: bfloat16 or float16
        for an adapter saved in it whose scaling is a power of two (alpha = 2r, alpha = r, ...), float32
        otherwise. A slot may store the adapter in it and compute exactly what float32 would (the CPU pool does,
        engine/lora/layers.py): half the bytes a decode step reads for it, and the same outputs."""
        tensors = [t for module in self.modules.values() for t in (module.lora_a, module.lora_b)]
        for dtype in HALF_DTYPES:
            if all(torch.equal(t.to(dtype).to(t.dtype), t) for t in tensors):
                return dtype
        return torch.float32

    @property
    def nbytes(self) -> int:
        """The host memory its tensors take."""
        return sum(m.lora_a.nbytes + m.lora_b.nbytes for m in self.modules.values())


def lora_module_shapes(config: ModelConfig) -> dict[str, ModuleShape]:
    """The base model's weight shape of each projection an adapter may target."""
    q = config.num_heads * config.head_dim
    kv = config.num_kv_heads * config.head_dim
    hidden, inter = config.hidden_size, config.intermediate_size
    return {
        "q_proj": ModuleShape(hidden, q),
        "k_proj": ModuleShape(hidden, kv),
        "v_proj": ModuleShape(hidden, kv),
        "o_proj": ModuleShape(q, hidden),
        "gate_proj": ModuleShape(hidden, inter),
        "up_proj": ModuleShape(hidden, inter),
        "down_proj": ModuleShape(inter, hidden),
    }


# Room for a weights file's safetensors header (names, shapes, offsets) beyond its tensors: generous,
# since a header is a few kB for a 32-layer model.
SAFETENSORS_HEADER_ALLOWANCE = 1024 * 1024


def largest_adapter_bytes(config: ModelConfig, max_rank: int) -> int:
    """The most a valid adapter's two files can hold for this base: adapter_model.safetensors with
    every module of every layer at max_rank in float32 (the widest dtype accepted) and its header,
    and the largest adapter_config.json accepted. An upload that unpacks to more cannot be an
    adapter this server would load."""
    per_layer = sum(shape.in_features + shape.out_features for shape in lora_module_shapes(config).values())
    return config.num_layers * per_layer * max_rank * 4 + SAFETENSORS_HEADER_ALLOWANCE + MAX_CONFIG_BYTES


@dataclass(frozen=True)
class AdapterSummary:
    """What a registry records about a validated adapter."""

    rank: int  # the largest module rank
    alpha: float  # adapter_config.json lora_alpha (rank_pattern/alpha_pattern may vary it per module)
    target_modules: tuple[str, ...]  # sorted, e.g. ("o_proj", "q_proj", "v_proj")
    dtype: str  # of the LoRA tensors: "float16" | "bfloat16" | "float32", or "mixed"
    base_model: str | None  # adapter_config.json base_model_name_or_path, if it names one


def load_adapter_weights(directory: Path, model_config: ModelConfig, max_rank: int) -> AdapterWeights:
    """Read, validate and scale a PEFT LoRA adapter; raise AdapterLoadError on anything unusable."""
    return _load(Path(directory), model_config, max_rank)[0]


def inspect_adapter(directory: Path, model_config: ModelConfig, max_rank: int) -> AdapterSummary:
    """Every check load_adapter_weights makes (the config's fields, NaN/Inf, the bounds on the scaled
    weights), then a summary instead of the weights: what an upload is validated with before anything
    is registered."""
    weights, peft_config, dtypes = _load(Path(directory), model_config, max_rank)
    return AdapterSummary(
        rank=weights.rank,
        alpha=peft_config.lora_alpha,
        target_modules=tuple(sorted(weights.target_modules)),
        dtype=str(ACCEPTED_DTYPES[next(iter(dtypes))]).removeprefix("torch.") if len(dtypes) == 1 else "mixed",
        base_model=peft_config.base_model,
    )


def base_model_matches(declared: str | None, served_model_name: str) -> bool:
    """Whether an adapter's declared base (a hub id such as "HuggingFaceTB/SmolLM2-135M-Instruct" or the
    local path it was trained from) names the served model, compared by last path component. An adapter
    that declares none is not refused here: the shape checks still guard it."""
    if declared is None:
        return True
    return declared.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lower() == served_model_name.lower()


def _load(
    directory: Path, model_config: ModelConfig, max_rank: int
) -> tuple[AdapterWeights, PeftLoRAConfig, set[str]]:
    """(scaled weights, adapter_config.json, safetensors dtypes of the LoRA tensors)."""
    peft_config = read_peft_config(directory)
    weights_path = _weights_path(directory)
    try:
        with safe_open(str(weights_path), framework="pt") as tensors:
            headers = {name: _header(tensors, name) for name in tensors.keys()}
            # Validate shapes and dtypes from the header alone: nothing is read until all of it is sound.
            plan = _validate_headers(headers, peft_config, model_config, max_rank)
            modules = {key: _scaled_module(tensors, module) for key, module in plan.items()}
    except SafetensorError as error:
        raise AdapterLoadError(f"adapter: {weights_path} is not a valid safetensors file ({error})") from error
    weights = AdapterWeights(rank=max(a.lora_a.shape[0] for a in modules.values()), modules=modules)
    return weights, peft_config, {dtype for _, dtype in headers.values()}


def _weights_path(directory: Path) -> Path:
    path = directory / ADAPTER_WEIGHTS_FILE
    if path.is_file():
        return path
    pickles = [name for name in PICKLE_WEIGHTS_FILES if (directory / name).is_file()]
    if pickles:
        raise AdapterLoadError(
            f"adapter: found only {pickles[0]}, a pickle file, which is never loaded because unpickling runs code; "
            f"re-save the adapter with save_pretrained(safe_serialization=True) to get {ADAPTER_WEIGHTS_FILE}"
        )
    raise AdapterLoadError(f"adapter: {path} not found")


def _header(tensors, name: str) -> tuple[tuple[int, ...], str]:
    """(shape, safetensors dtype string) of one tensor, read from the file header without loading it."""
    tensor_slice = tensors.get_slice(name)
    return tuple(tensor_slice.get_shape()), tensor_slice.get_dtype()


def _validate_headers(
    headers: dict[str, tuple[tuple[int, ...], str]],
    peft_config: PeftLoRAConfig,
    model_config: ModelConfig,
    max_rank: int,
) -> dict[tuple[int, str], ModulePlan]:
    """Check every tensor name, dtype and shape; return what to read for each (layer, module)."""
    shapes = lora_module_shapes(model_config)
    found: dict[tuple[int, str], dict[str, str]] = {}
    hf_names: dict[tuple[int, str], str] = {}
    for name, (_, dtype) in sorted(headers.items()):
        if any(part in name.split(".") for part in _BASE_ONLY_MODULES):
            raise AdapterLoadError(
                f"adapter: tensor {name!r} holds embed_tokens/lm_head weights; the base's embeddings and lm_head are "
                "shared by every adapter, so only LoRA on q/k/v/o/gate/up/down projections is served"
            )
        match = _TENSOR_NAME.fullmatch(name)
        if match is None or LORA_MODULE_PARENTS.get(match.group(4)) != match.group(3):
            raise AdapterLoadError(
                f"adapter: tensor {name!r} is not a LoRA weight of a supported module; expected "
                "base_model.model.model.layers.<i>.{self_attn|mlp}.<module>.lora_{A|B}.weight with <module> one of "
                f"{', '.join(LORA_MODULE_PARENTS)}"
            )
        hf_name, layer, module, side = match.group(1), int(match.group(2)), match.group(4), match.group(5)
        if layer >= model_config.num_layers:
            raise AdapterLoadError(
                f"adapter: tensor {name!r} is for layer {layer} but the base model has only {model_config.num_layers} "
                "layers; the adapter was trained for another base model"
            )
        if dtype not in ACCEPTED_DTYPES:
            raise AdapterLoadError(f"adapter: tensor {name!r} has dtype {dtype}; expected one of "
                                   f"{', '.join(ACCEPTED_DTYPES)}")
        if side in found.setdefault((layer, module), {}):
            raise AdapterLoadError(f"adapter: module {hf_name} has two lora_{side} tensors "
                                   f"({found[layer, module][side]!r} and {name!r}); expected one")
        found[layer, module][side] = name
        hf_names[layer, module] = hf_name
    if not found:
        raise AdapterLoadError(f"adapter: {ADAPTER_WEIGHTS_FILE} holds no LoRA tensors")

    plan: dict[tuple[int, str], ModulePlan] = {}
    for key, names in found.items():
        hf_name, module = hf_names[key], key[1]
        missing = {"A", "B"} - names.keys()
        if missing:
            raise AdapterLoadError(f"adapter: module {hf_name} has no lora_{missing.pop()} tensor; "
                                   "each module needs both lora_A and lora_B")
        lora = peft_config.module_lora(hf_name)
        rank = lora.rank
        if rank > max_rank:
            raise AdapterLoadError(f"adapter: module {hf_name} has rank {rank}, above the server's max LoRA rank "
                                   f"{max_rank}; retrain with r <= {max_rank}", param=lora.rank_field)
        base = shapes[module]
        expected = {"A": (rank, base.in_features), "B": (base.out_features, rank)}
        for side in ("A", "B"):
            actual = headers[names[side]][0]
            if actual != expected[side]:
                raise AdapterLoadError(
                    f"adapter: module {hf_name} lora_{side} has shape {list(actual)}, expected {list(expected[side])} "
                    f"(rank {rank}, base weight [out={base.out_features}, in={base.in_features}]); "
                    "the adapter was trained for another base model or its config's r does not match its weights"
                )
        plan[key] = ModulePlan(hf_name, names, lora)
    # After the shapes: a module the base does not have in that shape says more than the selection does.
    _refuse_unselected(hf_names, peft_config.selection)
    return plan


def _refuse_unselected(hf_names: dict[tuple[int, str], str], selection: ModuleSelection) -> None:
    """PEFT applies only the modules its config selects and skips other weights in the file; applying them
    would serve another model than the one trained, skipping them would hide a broken upload: refuse."""
    unselected = [hf_names[key] for key in sorted(hf_names) if not selection.selects(hf_names[key])]
    if unselected:
        shown = ", ".join(unselected[:5]) + (f" and {len(unselected) - 5} more" if len(unselected) > 5 else "")
        field = "target_modules" if selection.layers is None else "layers_to_transform"
        raise AdapterLoadError(
            f"adapter: {ADAPTER_WEIGHTS_FILE} holds weights for {len(unselected)} module"
            f"{'s' if len(unselected) > 1 else ''} that {ADAPTER_CONFIG_FILE} "
            f"does not select ({selection.describe()}): {shown}; PEFT would not apply them. Save the adapter again "
            "with save_pretrained, or make the config select exactly the modules it was trained on",
            param=field,
        )


def _scaled_module(tensors, plan: ModulePlan) -> LoRAModuleWeights:
    """Read one module's tensors, check them, and fold the scaling into lora_B. Bounds the weights break on
    their own are the weights' fault; bounds broken only once scaled are the alpha's, and name its field."""
    names, lora, module = plan.tensor_names, plan.lora, plan.hf_name
    lora_a = tensors.get_tensor(names["A"]).float()  # [r, in]
    lora_b = tensors.get_tensor(names["B"]).float()  # [out, r]
    for side, tensor in (("A", lora_a), ("B", lora_b)):
        if not torch.isfinite(tensor).all():
            raise AdapterLoadError(f"adapter: tensor {names[side]!r} contains NaN or Inf values; the adapter is "
                                   "corrupt or its training diverged")
        peak = tensor.abs().max().item()
        if peak > MAX_LORA_ENTRY:
            raise AdapterLoadError(f"adapter: tensor {names[side]!r} has an entry of magnitude {peak:.3g}, above "
                                   f"the bound of {MAX_LORA_ENTRY:g} that trained LoRA weights stay far below; the "
                                   "adapter is corrupt or its training diverged")
    delta = _delta_norm(lora_a, lora_b)
    if delta > MAX_DELTA_NORM:
        raise AdapterLoadError(f"adapter: module {module}: its delta lora_B @ lora_A has norm {delta:.3g}, above "
                               f"the bound of {MAX_DELTA_NORM:g} that trained adapters stay far below; the adapter "
                               "is corrupt or its training diverged")
    scaled_b = lora_b * lora.scaling  # in float32, as served: 0 x an alpha/r past float32's range is NaN
    if not (torch.isfinite(scaled_b).all() and scaled_b.abs().max().item() <= MAX_LORA_ENTRY
            and delta * lora.scaling <= MAX_DELTA_NORM):
        scaling_rule = "alpha/sqrt(r)" if lora.rslora else "alpha/r"
        raise AdapterLoadError(
            f"adapter: module {module}: {lora.alpha_field} gives it alpha {lora.alpha:g}, so lora_B is scaled by "
            f"{scaling_rule} = {lora.scaling:.3g} (r = {lora.rank}), and its effective weights (entries up to "
            f"{scaled_b.abs().max().item():.3g}, a delta of norm {delta * lora.scaling:.3g}) are not finite or "
            f"exceed the bound of {MAX_LORA_ENTRY:g} that trained adapters stay far below; set {lora.alpha_field} "
            "to the alpha the adapter was trained with",
            param=lora.alpha_field,
        )
    return LoRAModuleWeights(lora_a=lora_a.contiguous(), lora_b=scaled_b.contiguous())


def _delta_norm(lora_a: torch.Tensor, lora_b: torch.Tensor) -> float:
    """Frobenius norm of lora_B @ lora_A without forming the [out, in] product: ||BA||^2 = <B^T B, A A^T>,
    two [r, r] matrices. In float64, where entries bounded by MAX_LORA_ENTRY cannot overflow."""
    a, b = lora_a.double(), lora_b.double()
    return math.sqrt(max(0.0, ((b.T @ b) * (a @ a.T)).sum().item()))

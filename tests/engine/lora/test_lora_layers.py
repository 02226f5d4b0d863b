"""LoRA: PEFT adapter loading and validation, the slot pool, LoRALinear, SGMV metadata, and
logits of a mixed multi-adapter batch against Hugging Face + PEFT."""
from __future__ import annotations

import dataclasses
import json
import random
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from lora_factory import make_peft_adapter
from loraloom.engine.config import ModelConfig
from loraloom.engine.model.layers import Linear
from loraloom.engine.model.loader import load_model
from loraloom.engine.lora.errors import AdapterLoadError
from loraloom.engine.lora.files import ADAPTER_WEIGHTS_FILE
from loraloom.engine.lora.layers import LoRALinear, LoRASlotPool, attach_lora, build_sgmv_metadata
from loraloom.engine.lora.weights import load_adapter_weights
from loraloom.engine.model.llama import PACKED_MODULES, allocate_kv_cache
from loraloom.kernels.backend import REFERENCE_BACKEND
from loraloom.kernels.lora_stacks import PANEL_WIDTH, PackedStack, SliceStack
from loraloom.kernels.metadata import AttentionMetadata

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# ----------------------------------------------------------------------------- fixtures
# model_dir (the bundled model) and tiny_llama_dir (a random 2-layer Llama) come from tests/conftest.py.


@pytest.fixture(scope="module")
def tiny_config(tiny_llama_dir):
    return ModelConfig.from_dir(tiny_llama_dir)


def tiny_adapter(tiny_llama_dir, tmp_path, rank=4, target_modules=("q_proj", "v_proj"), **options):
    return make_peft_adapter(tiny_llama_dir, tmp_path / "adapter", rank=rank, alpha=2 * rank,
                             target_modules=list(target_modules), seed=7, **options)


# ----------------------------------------------------------------------------- validation


def test_loads_peft_weights_with_scaling_folded_into_b(tiny_llama_dir, tiny_config, tmp_path):
    path = tiny_adapter(tiny_llama_dir, tmp_path, rank=4, target_modules=ALL_MODULES, use_rslora=True)
    raw = load_file(str(path / ADAPTER_WEIGHTS_FILE))
    weights = load_adapter_weights(path, tiny_config, max_rank=8)
    assert weights.rank == 4
    assert weights.target_modules == frozenset(ALL_MODULES)
    assert len(weights.modules) == tiny_config.num_layers * len(ALL_MODULES)
    prefix = "base_model.model.model.layers.1.mlp.down_proj"
    module = weights.modules[1, "down_proj"]
    torch.testing.assert_close(module.lora_a, raw[f"{prefix}.lora_A.weight"])
    torch.testing.assert_close(module.lora_b, raw[f"{prefix}.lora_B.weight"] * (8 / 4 ** 0.5))  # rsLoRA: alpha/sqrt(r)


def test_refuses_rank_above_max(tiny_llama_dir, tiny_config, tmp_path):
    path = tiny_adapter(tiny_llama_dir, tmp_path, rank=16)
    with pytest.raises(AdapterLoadError, match=r"rank 16.*max LoRA rank 8"):
        load_adapter_weights(path, tiny_config, max_rank=8)


def test_refuses_adapter_for_another_base(tiny_llama_dir, tiny_config, model_dir, tmp_path):
    path = tiny_adapter(tiny_llama_dir, tmp_path, target_modules=["q_proj"])
    bundled = ModelConfig.from_dir(model_dir)
    expected = rf"\[4, {tiny_config.hidden_size}\], expected \[4, {bundled.hidden_size}\]"
    with pytest.raises(AdapterLoadError, match=rf"model\.layers\.0\.self_attn\.q_proj lora_A has shape {expected}"):
        load_adapter_weights(path, bundled, max_rank=64)


def test_refuses_layer_beyond_the_base(tiny_llama_dir, tiny_config, tmp_path):
    path = tiny_adapter(tiny_llama_dir, tmp_path)
    one_layer = dataclasses.replace(tiny_config, num_layers=1)
    with pytest.raises(AdapterLoadError, match=r"layers\.1\..*layer 1 but the base model has only 1 layers"):
        load_adapter_weights(path, one_layer, max_rank=8)


def test_refuses_modules_to_save(tiny_llama_dir, tiny_config, tmp_path):
    path = tiny_adapter(tiny_llama_dir, tmp_path, modules_to_save=["lm_head"])
    with pytest.raises(AdapterLoadError, match=r"modules_to_save \['lm_head'\]"):
        load_adapter_weights(path, tiny_config, max_rank=8)


@pytest.mark.parametrize("base_module", ["lm_head", "embed_tokens"])
def test_refuses_lm_head_and_embedding_weights(tiny_llama_dir, tiny_config, tmp_path, base_module):
    path = tiny_adapter(tiny_llama_dir, tmp_path, target_modules=["q_proj", base_module])
    with pytest.raises(AdapterLoadError, match=rf"tensor '[\w.]*{base_module}[\w.]*' holds embed_tokens/lm_head"):
        load_adapter_weights(path, tiny_config, max_rank=8)


def test_refuses_pickle_only_directory(tiny_llama_dir, tiny_config, tmp_path):
    path = tiny_adapter(tiny_llama_dir, tmp_path, safe_serialization=False)
    assert (path / "adapter_model.bin").is_file() and not (path / ADAPTER_WEIGHTS_FILE).is_file()
    with pytest.raises(AdapterLoadError, match=r"adapter_model\.bin, a pickle file"):
        load_adapter_weights(path, tiny_config, max_rank=8)


def _rewrite_tensors(path, edit) -> None:
    tensors = load_file(str(path / ADAPTER_WEIGHTS_FILE))
    edit(tensors)
    save_file(tensors, str(path / ADAPTER_WEIGHTS_FILE))


Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


def _put_nan(tensors):
    tensors[Q_A][1, 2] = float("nan")


def _rename_module(tensors):
    tensors[Q_A.replace("q_proj", "qkv_proj")] = tensors.pop(Q_A)


def _to_int(tensors):
    tensors[Q_A] = tensors[Q_A].to(torch.int32)


def _drop_b(tensors):
    del tensors[Q_A.replace("lora_A", "lora_B")]


@pytest.mark.parametrize("edit, message", [
    (_put_nan, rf"tensor '{re.escape(Q_A)}' contains NaN"),
    (_rename_module, r"tensor '[\w.]*qkv_proj\.lora_A\.weight' is not a LoRA weight of a supported module"),
    (_to_int, rf"tensor '{re.escape(Q_A)}' has dtype I32"),
    (_drop_b, r"model\.layers\.0\.self_attn\.q_proj has no lora_B tensor"),
])
def test_refuses_corrupt_tensors(tiny_llama_dir, tiny_config, tmp_path, edit, message):
    path = tiny_adapter(tiny_llama_dir, tmp_path)
    _rewrite_tensors(path, edit)
    with pytest.raises(AdapterLoadError, match=message):
        load_adapter_weights(path, tiny_config, max_rank=8)


def test_refuses_rank_that_disagrees_with_config(tiny_llama_dir, tiny_config, tmp_path):
    path = tiny_adapter(tiny_llama_dir, tmp_path, rank=4)
    config_path = path / "adapter_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "r": 2}))
    with pytest.raises(AdapterLoadError, match=r"lora_A has shape \[4, 64\], expected \[2, 64\]"):
        load_adapter_weights(path, tiny_config, max_rank=8)


def test_accepts_bfloat16_weights(tiny_llama_dir, tiny_config, tmp_path):
    path = tiny_adapter(tiny_llama_dir, tmp_path)
    fp32 = load_adapter_weights(path, tiny_config, max_rank=8)
    _rewrite_tensors(path, lambda tensors: tensors.update({k: v.bfloat16() for k, v in tensors.items()}))
    bf16 = load_adapter_weights(path, tiny_config, max_rank=8)
    module = bf16.modules[0, "q_proj"]
    assert module.lora_a.dtype == torch.float32
    torch.testing.assert_close(module.lora_a, fp32.modules[0, "q_proj"].lora_a.bfloat16().float())


# ----------------------------------------------------------------------------- slot pool


@pytest.mark.parametrize("stack_type", [PackedStack, SliceStack])
def test_pool_load_replaces_and_zero_fills(tiny_llama_dir, tiny_config, tmp_path, stack_type):
    big = load_adapter_weights(
        tiny_adapter(tiny_llama_dir, tmp_path / "big", rank=8, target_modules=ALL_MODULES), tiny_config, max_rank=8)
    small = load_adapter_weights(tiny_adapter(tiny_llama_dir, tmp_path / "small", rank=2), tiny_config, max_rank=8)
    backend = dataclasses.replace(REFERENCE_BACKEND, lora_stack=stack_type)
    pool = LoRASlotPool(model_config=tiny_config, num_slots=3, max_rank=8, dtype=torch.float32, device="cpu",
                        backend=backend)
    pool.load(0, big)
    pool.load(2, big)
    pool.load(2, small)  # must leave nothing of `big` behind in slot 2
    assert pool.slot_ranks_host == [8, 0, 2]
    for layer in range(tiny_config.num_layers):
        for path, modules in PACKED_MODULES.items():
            stack = pool.stacks[layer][path]
            for slot, adapter in ((0, big), (2, small)):
                assert slot_weights(stack, slot) == [
                    None if (layer, name) not in adapter.modules
                    else (adapter.modules[layer, name].lora_a.tolist(), adapter.modules[layer, name].lora_b.tolist())
                    for name in modules]
            assert not any(tensor[1].any() for tensor in stack.tensors())
    pool.clear(0)
    assert pool.slot_ranks_host == [0, 0, 2]
    assert not any(tensor[0].any() for tensor in pool.tensors())
    with pytest.raises(IndexError, match="slot 3 is out of range"):
        pool.load(3, small)


def slot_weights(stack, slot: int) -> list:
    """What a stack holds for a slot, per slice: (A, B) at the slice's rank as lists, None if untargeted;
    checks that everything past the rank is zero on the way."""
    if isinstance(stack, SliceStack):
        held = []
        for i, (a, b) in enumerate(zip(stack.lora_a, stack.lora_b)):
            rank = stack.ranks.host[i][slot]
            assert int(stack.ranks.device[i, slot]) == rank
            assert not a[slot, rank:].any() and not b[slot, :, rank:].any()
            held.append((a[slot, :rank].tolist(), b[slot, :, :rank].tolist()) if rank else None)
        return held
    # The slot's row: its A rows at their ranks, then each targeted slice's B^T [r, out] as column panels
    # (the panel of columns [start, start + width) an [r, width] block at r * start), then zeros.
    views = stack.slots[slot]
    row_of_weights = stack.weights[slot]
    held = [None] * len(stack.out_features)
    total = sum(views.split) if views else 0
    a_rows = row_of_weights[:total * stack.in_features].view(total, stack.in_features)
    row, offset = 0, total * stack.in_features
    for (i, panels), rank in zip(views.expands if views else [], views.split if views else []):
        out = stack.out_features[i]
        region = row_of_weights[offset:offset + rank * out]
        columns = [region[rank * start:rank * min(start + PANEL_WIDTH, out)].view(rank, -1)
                   for start in range(0, out, PANEL_WIDTH)]
        b_t = torch.cat(columns, dim=1)
        assert torch.equal(b_t, panels.dense())
        held[i] = (a_rows[row:row + rank].tolist(), b_t.T.tolist())
        row += rank
        offset += rank * out
    assert not row_of_weights[offset:].any()
    return held


# ----------------------------------------------------------------------------- LoRALinear


def filled_stack(stack_type, slice_ranks: list[list[int]], in_features: int, slice_sizes: tuple[int, ...],
                 dtype: torch.dtype, gen: torch.Generator):
    """A stack with random weights per [slice][slot] rank (0: slice not targeted); also returns the weights."""
    num_slots, max_rank = len(slice_ranks[0]), 8
    stack = stack_type.allocate(num_slots, max_rank, in_features, list(slice_sizes), dtype, "cpu")
    weights = [[None if rank == 0 else (torch.randn(rank, in_features, generator=gen, dtype=dtype),
                                        torch.randn(size, rank, generator=gen, dtype=dtype))
                for size, rank in zip(slice_sizes, [ranks[slot] for ranks in slice_ranks])]
               for slot in range(num_slots)]
    for slot, slices in enumerate(weights):
        stack.load(slot, slices)
    return stack, weights


@pytest.mark.parametrize("token_slots", [[1, -1, 0, 1, 0, -1, 1], [-1, -1, 0, 0, 1, 1, 1]],
                         ids=["scattered", "grouped"])
def test_lora_linear_matches_fp64_loop(token_slots):
    """Per-slice ranks: slot 0 targets slices 0 and 2 at different ranks, slot 1 all three, slot 2 nothing."""
    gen = torch.Generator().manual_seed(3)
    in_features, slice_sizes = 24, (16, 8, 8)
    slice_ranks = [[8, 3, 0], [0, 3, 0], [5, 1, 0]]  # [slice][slot]
    base = Linear(in_features, slice_sizes, torch.float64, "cpu")
    base.weight.data = torch.randn(sum(slice_sizes), in_features, generator=gen, dtype=torch.float64)
    stack, weights = filled_stack(PackedStack, slice_ranks, in_features, slice_sizes, torch.float64, gen)
    layer = LoRALinear(base, stack, REFERENCE_BACKEND)
    x = torch.randn(len(token_slots), in_features, generator=gen, dtype=torch.float64)

    out = layer(x, build_sgmv_metadata(token_slots, [8, 3, 0], "cpu"))

    expected = torch.empty(len(token_slots), sum(slice_sizes), dtype=torch.float64)
    for t, slot in enumerate(token_slots):
        expected[t] = base.weight @ x[t]
        if slot >= 0:
            offset = 0
            for pair, size in zip(weights[slot], slice_sizes):
                if pair is not None:
                    expected[t, offset:offset + size] += pair[1] @ (pair[0] @ x[t])
                offset += size
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(layer(x, None), x @ base.weight.T)


def test_lora_linear_gives_base_tokens_exact_zeros_whatever_the_slots_hold():
    """A slot holding Inf/NaN (say, a bad adapter) changes no row but its own segment's: base tokens and
    other adapters' tokens get exactly the base output, not 0 x Inf."""
    in_features, slice_sizes = 8, (4, 4)
    base = Linear(in_features, slice_sizes, torch.float32, "cpu")
    base.weight.data = torch.randn(sum(slice_sizes), in_features)
    stack = PackedStack.allocate(2, 2, in_features, list(slice_sizes), torch.float32, "cpu")
    stack.load(0, [(torch.full((2, in_features), float("inf")), torch.full((size, 2), float("nan")))
                   for size in slice_sizes])
    stack.load(1, [(torch.randn(2, in_features), torch.randn(size, 2)) for size in slice_sizes])
    layer = LoRALinear(base, stack, REFERENCE_BACKEND)
    token_slots = [-1, 0, 1, -1, 1]
    x = torch.randn(len(token_slots), in_features)

    out = layer(x, build_sgmv_metadata(token_slots, [2, 2], "cpu"))

    base_out = x @ base.weight.T
    assert torch.equal(out[[0, 3]], base_out[[0, 3]])
    assert torch.isfinite(out[[2, 4]]).all() and not torch.isfinite(out[1]).any()


# ----------------------------------------------------------------------------- SGMV metadata
# The plan itself: tests/kernels/test_sgmv_plan.py.


def test_sgmv_metadata_base_only_is_none_and_empty_slot_refused():
    assert build_sgmv_metadata([-1, -1, -1], [8, 0], "cpu") is None
    assert build_sgmv_metadata([], [8, 0], "cpu") is None
    with pytest.raises(ValueError, match="token 1 maps to slot 1, which is not a loaded slot"):
        build_sgmv_metadata([0, 1], [8, 0], "cpu")
    with pytest.raises(ValueError, match="token 2 maps to slot 5, which is not a loaded slot"):
        build_sgmv_metadata([0, -1, 5], [8, 0], "cpu")
    with pytest.raises(ValueError, match="token 0 maps to slot -2"):
        build_sgmv_metadata([-2], [8, 0], "cpu")


# ----------------------------------------------------------------------------- mixed batch vs PEFT

BLOCK_SIZE = 4
ADAPTER_SPECS = [  # name, make_peft_adapter options
    ("r4-qv", dict(rank=4, alpha=8, target_modules=["q_proj", "v_proj"])),
    ("r8-all", dict(rank=8, alpha=16, target_modules=ALL_MODULES,
                    rank_pattern={"down_proj": 4}, alpha_pattern={"o_proj": 32})),
    ("r16-o-down-rslora", dict(rank=16, alpha=16, target_modules=["o_proj", "down_proj"], use_rslora=True)),
    ("r64-gate-up-k", dict(rank=64, alpha=32, target_modules=["gate_proj", "up_proj", "k_proj"])),
]
SLOT_OF_ADAPTER = [2, 0, 4, 1]  # slot 3 stays empty
REQUEST_ADAPTERS = [None, 0, 1, None, 2, 3, 1]  # adapter index per request; None = base
STEP_CHUNKS = [-3, 2, 1]  # step 1 prefills all but the last 3 tokens, then a 2-token chunk, then a decode


@pytest.fixture(scope="module")
def peft_adapters(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed_adapters")
    return [make_peft_adapter(model_dir, root / name, seed=100 + i, **options)
            for i, (name, options) in enumerate(ADAPTER_SPECS)]


def _peft_logits(model_dir, adapter_dirs, prompts) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per request: (PEFT logits with its adapter, logits of the base), each [L, vocab]."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(hf, adapter_dirs[0], adapter_name="a0")
    for index, directory in enumerate(adapter_dirs[1:], start=1):
        model.load_adapter(directory, adapter_name=f"a{index}")
    model.eval()
    results = []
    with torch.inference_mode():
        for prompt, adapter in zip(prompts, REQUEST_ADAPTERS):
            ids = torch.tensor([prompt])
            with model.disable_adapter():
                base = model(input_ids=ids).logits[0]
            if adapter is None:
                results.append((base, base))
                continue
            model.set_adapter(f"a{adapter}")
            results.append((model(input_ids=ids).logits[0], base))
    return results


def _attention_metadata(chunks: list[tuple[int, int, list[int]]]) -> AttentionMetadata:
    """chunks: per request (first new position, end position, block ids)."""
    query_start_loc, seq_lens, slot_mapping = [0], [], []
    for start, end, blocks in chunks:
        query_start_loc.append(query_start_loc[-1] + end - start)
        seq_lens.append(end)
        slot_mapping += [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(start, end)]
    width = max(len(blocks) for _, _, blocks in chunks)
    tables = torch.tensor([blocks + [0] * (width - len(blocks)) for _, _, blocks in chunks], dtype=torch.int32)
    return AttentionMetadata(
        query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=tables,
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64),
        query_start_loc_host=query_start_loc,
        seq_lens_host=seq_lens,
    )


def test_mixed_adapter_batch_matches_peft(model_dir, peft_adapters):
    config = ModelConfig.from_dir(model_dir)
    rng = random.Random(11)
    prompts = [[rng.randrange(config.vocab_size) for _ in range(rng.randrange(7, 14))] for _ in REQUEST_ADAPTERS]

    model = load_model(model_dir, torch.float32, "cpu")
    pool = LoRASlotPool(model_config=config, num_slots=5, max_rank=64, dtype=torch.float32, device="cpu")
    attach_lora(model, pool)
    for directory, slot in zip(peft_adapters, SLOT_OF_ADAPTER):
        pool.load(slot, load_adapter_weights(directory, config, max_rank=64))
    request_slots = [-1 if adapter is None else SLOT_OF_ADAPTER[adapter] for adapter in REQUEST_ADAPTERS]

    num_blocks = sum(-(-len(p) // BLOCK_SIZE) for p in prompts) + 2
    kv_caches = allocate_kv_cache(config, num_blocks, BLOCK_SIZE, torch.float32, "cpu")
    free_blocks = list(range(num_blocks))
    rng.shuffle(free_blocks)  # scattered, non-contiguous block tables
    blocks = [[free_blocks.pop() for _ in range(-(-len(p) // BLOCK_SIZE))] for p in prompts]

    ours = [[] for _ in prompts]  # per request: logits rows [1, vocab] in position order
    done = [0] * len(prompts)
    with torch.inference_mode():
        for chunk in STEP_CHUNKS:
            ends = [len(p) + chunk if chunk < 0 else done[r] + chunk for r, p in enumerate(prompts)]
            chunks = [(done[r], ends[r], blocks[r]) for r in range(len(prompts))]
            input_ids = [t for r, p in enumerate(prompts) for t in p[done[r]:ends[r]]]
            positions = [pos for start, end, _ in chunks for pos in range(start, end)]
            token_slots = [request_slots[r] for r in range(len(prompts)) for _ in range(done[r], ends[r])]
            hidden = model(  # [T, hidden]
                torch.tensor(input_ids), torch.tensor(positions), kv_caches, _attention_metadata(chunks),
                build_sgmv_metadata(token_slots, pool.slot_ranks_host, "cpu"),
            )
            logits = model.compute_logits(hidden)  # [T, vocab]
            row = 0
            for r in range(len(prompts)):
                ours[r].append(logits[row:row + ends[r] - done[r]])
                row += ends[r] - done[r]
            done = ends
    assert done == [len(p) for p in prompts]

    references = _peft_logits(model_dir, peft_adapters, prompts)
    for r, ((expected, base), adapter) in enumerate(zip(references, REQUEST_ADAPTERS)):
        got = torch.cat(ours[r])  # [L, vocab]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-3, msg=lambda m: f"request {r}: {m}")
        if adapter is not None:  # the adapter really changes this request's predictions: the check has teeth
            assert (expected.argmax(-1) != base.argmax(-1)).any(), f"adapter {adapter} leaves greedy output unchanged"

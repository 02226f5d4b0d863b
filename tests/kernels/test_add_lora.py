"""add_lora, the op LoRALinear calls: the CPU paths (kernels/reference.py and the compiled op of
kernels/packed_lora.py, both over a PackedStack) and the Triton path (interpreted here, over a SliceStack) against the LoRA delta written from its
definition in fp64.

Each slot has its own rank per slice, 0 where its adapter does not target the module. The stacks
are loaded as the slot pool loads them, then poisoned: NaN past every slot's rank in every slice
and everywhere in a slice the slot does not target, so reading any weight an adapter does not own
poisons the result. The base output starts from random values, so rows and columns that must
stay untouched are checked too.
"""
from __future__ import annotations

import pytest
import torch

from loraloom.kernels import cpu_extension, packed_lora, reference, sgmv
from loraloom.kernels.lora_stacks import PANEL_WIDTH, WEIGHT_TYPE_CODES, PackedStack, SliceStack
from loraloom.kernels.metadata import SliceRanks, segment_table
from sgmv_cases import sgmv_metadata

IN_FEATURES = 200
# q/k/v-like slices; on the CPU, B is kept in column panels of PANEL_WIDTH (64): two whole panels and
# a narrower last one, a last panel alone, and exactly one whole panel.
OUT_FEATURES = [136, 24, 64]
OFFSETS = [0, 136, 160, 224]
MAX_RANK = 64
TOLERANCES = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=4e-3, rtol=4e-3)}

# slot -> rank in each of the three slices. Ranks 1, 3, 48 and 64 side by side; slot 2 targets
# the first slice only (an attention adapter without k/v, say); slot 4 targets none of this
# layer's slices (an MLP-only adapter seen from qkv); slot 5 targets only the last two.
ALL_SLICES = [[1, 3, 48, 64, 0, 0, 16], [1, 3, 0, 64, 0, 7, 16], [1, 3, 0, 64, 0, 7, 16]]


def make_ranks(host: list[list[int]]) -> SliceRanks:
    return SliceRanks(device=torch.tensor(host, dtype=torch.int32), host=[list(row) for row in host])


def make_weights(host: list[list[int]], dtype: torch.dtype, generator: torch.Generator):
    """Per slice A [S, R, in] and B [S, out_i, R] at MAX_RANK, random (the kernels must read only [:rank])."""
    slots = len(host[0])
    lora_a = [(torch.randn(slots, MAX_RANK, IN_FEATURES, generator=generator) / IN_FEATURES ** 0.5).to(dtype)
              for _ in host]
    lora_b = [(torch.randn(slots, out_features, MAX_RANK, generator=generator) / 8).to(dtype)
              for out_features in OUT_FEATURES[:len(host)]]
    return lora_a, lora_b


def stack_type(implementation: str):
    return SliceStack if implementation == "triton" else PackedStack


def load_slots(stack, host: list[list[int]], lora_a, lora_b, slot_dtypes: list[torch.dtype] | None = None) -> None:
    """Load every slot at its per-slice ranks, as the slot pool does (rank 0: the slice is not targeted),
    slot s stored as slot_dtypes[s] (default: the stack's dtype)."""
    for slot in range(len(host[0])):
        stack.load(slot, [(a[slot, :ranks[slot]], b[slot, :, :ranks[slot]]) if ranks[slot] else None
                          for a, b, ranks in zip(lora_a, lora_b, host)], slot_dtypes[slot] if slot_dtypes else None)


def poison_unowned(stack, host: list[list[int]], slot_dtypes: list[torch.dtype] | None = None) -> None:
    """NaN in every element no slot owns (rank padding, untargeted slices, the back of a region a narrower
    slot leaves unused), found by loading a twin stack with all-ones weights at the same ranks and dtypes."""
    ones_a = [torch.ones(len(host[0]), MAX_RANK, IN_FEATURES) for _ in host]
    ones_b = [torch.ones(len(host[0]), out_features, MAX_RANK) for out_features in OUT_FEATURES[:len(host)]]
    dtype = stack.tensors()[0].dtype
    twin = type(stack).allocate(len(host[0]), MAX_RANK, IN_FEATURES, OUT_FEATURES[:len(host)], dtype, "cpu")
    load_slots(twin, host, ones_a, ones_b, slot_dtypes)
    for tensor, owned in zip(stack.tensors(), twin.tensors()):
        for slot in range(len(host[0])):
            # Each slot's region as the dtype the op reads it as.
            slot_dtype = slot_dtypes[slot] if slot_dtypes else dtype
            region, owned_region = tensor[slot].view(-1).view(slot_dtype), owned[slot].view(-1).view(slot_dtype)
            region.masked_fill_(owned_region == 0, float("nan"))


def loaded_stack(implementation: str, host: list[list[int]], lora_a, lora_b,
                 slot_dtypes: list[torch.dtype] | None = None):
    stack = stack_type(implementation).allocate(len(host[0]), MAX_RANK, IN_FEATURES, OUT_FEATURES[:len(host)],
                                                lora_a[0].dtype, "cpu")
    load_slots(stack, host, lora_a, lora_b, slot_dtypes)
    poison_unowned(stack, host, slot_dtypes)
    return stack


def expected_output(x, lora_a, lora_b, host, token_slots, base_out) -> torch.Tensor:
    """The definition, token by token in fp64: out[t, slice i] += B_i[s, :, :r] @ (A_i[s, :r] @ x[t])."""
    expected = base_out.double().clone()
    for row, slot in enumerate(token_slots):
        if slot < 0:
            continue
        for i in range(len(lora_a)):
            rank = host[i][slot]
            if rank:
                a, b = lora_a[i][slot, :rank].double(), lora_b[i][slot, :, :rank].double()
                expected[row, OFFSETS[i]:OFFSETS[i + 1]] += b @ (a @ x[row].double())
    return expected


def scrambled(token_slots: list[int], seed: int) -> list[int]:
    order = torch.randperm(len(token_slots), generator=torch.Generator().manual_seed(seed)).tolist()
    return [token_slots[i] for i in order]


# Decode (one token per adapter), a prefill next to decodes, every adapter's rows grouped (the
# scheduler's order: views, no gather), and scrambled rows (gather + scatter).
STEPS = {
    "decode": [0, 1, 2, 3, 4, 5, 6, -1, -1],
    "prefill_and_decodes": [3] * 21 + [0, 1, 2, 4, 5, 6, -1],
    "grouped": [-1, -1] + [0] * 3 + [1] * 2 + [2] * 4 + [3] * 5 + [5] * 2 + [6] * 3,
    "scrambled": scrambled([-1, -1] + [0] * 3 + [1] * 2 + [2] * 4 + [3] * 5 + [4] * 2 + [5] * 2 + [6] * 3, seed=3),
    "scrambled_prefill": scrambled([3] * 12 + [6] * 9 + [0, 0, 1, -1, 5, 5, 5, 4], seed=5),
    # A segment larger than one thread's share of the step: the compiled op splits it into runs of rows
    # (300 rows: the last block of a run is partial) that several threads take.
    "long_prefill": [-1] + [2] * 300 + [6] * 20 + [0, 1],
}


def compiled_add_lora(*args) -> None:
    """The compiled op itself: packed_lora.add_lora would quietly fall back to the reference."""
    assert cpu_extension.load() is not None, "the CPU extension did not build (see kernels/cpu_extension.py)"
    packed_lora.add_lora(*args)


IMPLEMENTATIONS = {"reference": reference.add_lora, "compiled": compiled_add_lora, "triton": sgmv.add_lora}


# The CPU path serves fp32 activations (its 16-bit weights are checked below); the Triton one also runs
# fp16 (bf16 is checked on a GPU: the interpreter's bf16 tl.dot is unreliable).
VARIANTS = [("reference", torch.float32), ("compiled", torch.float32), ("triton", torch.float32),
            ("triton", torch.float16)]


@pytest.mark.parametrize(("implementation", "dtype"), VARIANTS)
@pytest.mark.parametrize("step", list(STEPS))
def test_add_lora_matches_definition(step: str, implementation: str, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(1)
    token_slots = STEPS[step]
    slot_ranks = [max(column) for column in zip(*ALL_SLICES)]
    meta = sgmv_metadata(token_slots, [rank or 1 for rank in slot_ranks])
    lora_a, lora_b = make_weights(ALL_SLICES, dtype, generator)
    x = torch.randn(len(token_slots), IN_FEATURES, generator=generator).to(dtype)
    base_out = torch.randn(len(token_slots), OFFSETS[-1], generator=generator).to(dtype)
    expected = expected_output(x, lora_a, lora_b, ALL_SLICES, token_slots, base_out)

    stack = loaded_stack(implementation, ALL_SLICES, lora_a, lora_b)

    IMPLEMENTATIONS[implementation](x, stack, meta, base_out, OFFSETS)

    torch.testing.assert_close(base_out.double(), expected, **TOLERANCES[dtype])
    untouched = [row for row, slot in enumerate(token_slots) if slot < 0 or slot == 4]
    assert torch.equal(base_out[untouched].double(), expected[untouched])  # base and untargeted rows: as they were


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("implementation", ["reference", "compiled"])
@pytest.mark.parametrize("step", list(STEPS))
def test_cpu_add_lora_with_16_bit_weights(step: str, implementation: str, weight_dtype: torch.dtype) -> None:
    """EngineConfig.lora_dtype on the CPU: float32 activations over 16-bit weights, every sum in float32,
    so the result is the definition over the stored (rounded) weights within float32 tolerance, on
    every step shape: decodes, grouped and scrambled rows, and a long segment split into runs."""
    generator = torch.Generator().manual_seed(7)
    token_slots = STEPS[step]
    meta = sgmv_metadata(token_slots, [max(column) or 1 for column in zip(*ALL_SLICES)])
    lora_a, lora_b = make_weights(ALL_SLICES, weight_dtype, generator)
    x = torch.randn(len(token_slots), IN_FEATURES, generator=generator)
    base_out = torch.randn(len(token_slots), OFFSETS[-1], generator=generator)
    expected = expected_output(x, lora_a, lora_b, ALL_SLICES, token_slots, base_out)
    stack = loaded_stack(implementation, ALL_SLICES, lora_a, lora_b)
    assert stack.weights.dtype == weight_dtype

    IMPLEMENTATIONS[implementation](x, stack, meta, base_out, OFFSETS)

    torch.testing.assert_close(base_out.double(), expected, **TOLERANCES[torch.float32])
    untouched = [row for row, slot in enumerate(token_slots) if slot < 0 or slot == 4]
    assert torch.equal(base_out[untouched].double(), expected[untouched])


# A float32 stack whose slots hold their adapters in their own dtypes (AdapterWeights.exact_dtype):
# bfloat16 and float16 slots next to float32 ones, the rank-64 slot among the narrow ones.
SLOT_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.bfloat16, torch.float32, torch.float16,
               torch.float32]


def weights_exact_in(lora_a, lora_b, slot_dtypes: list[torch.dtype]):
    """float32 weights whose slot s holds values slot_dtypes[s] represents exactly."""
    def exact(stack):
        return torch.stack([w.to(dtype).float() for w, dtype in zip(stack, slot_dtypes)])
    return [exact(a) for a in lora_a], [exact(b) for b in lora_b]


@pytest.mark.parametrize("implementation", ["reference", "compiled"])
@pytest.mark.parametrize("step", list(STEPS))
def test_cpu_add_lora_with_slots_of_their_own_dtype(step: str, implementation: str) -> None:
    """A slot stored narrower than its stack computes exactly what a float32 slot of the same values
    does: the definition within float32 tolerance, on every step shape, reading nothing it does not own."""
    generator = torch.Generator().manual_seed(9)
    token_slots = STEPS[step]
    meta = sgmv_metadata(token_slots, [max(column) or 1 for column in zip(*ALL_SLICES)])
    lora_a, lora_b = weights_exact_in(*make_weights(ALL_SLICES, torch.float32, generator), SLOT_DTYPES)
    x = torch.randn(len(token_slots), IN_FEATURES, generator=generator)
    base_out = torch.randn(len(token_slots), OFFSETS[-1], generator=generator)
    expected = expected_output(x, lora_a, lora_b, ALL_SLICES, token_slots, base_out)
    stack = loaded_stack(implementation, ALL_SLICES, lora_a, lora_b, SLOT_DTYPES)
    assert stack.slot_types.tolist() == [WEIGHT_TYPE_CODES[dtype] for dtype in SLOT_DTYPES]
    wide_out = base_out.clone()
    IMPLEMENTATIONS[implementation](x, loaded_stack(implementation, ALL_SLICES, lora_a, lora_b), meta, wide_out,
                                    OFFSETS)

    IMPLEMENTATIONS[implementation](x, stack, meta, base_out, OFFSETS)

    torch.testing.assert_close(base_out.double(), expected, **TOLERANCES[torch.float32])
    assert torch.equal(base_out, wide_out)  # the same sums over the same values, bit for bit


def test_a_slot_is_never_wider_than_its_stack() -> None:
    stack = PackedStack.allocate(1, 4, IN_FEATURES, OUT_FEATURES[:1], torch.bfloat16, "cpu")
    pair = (torch.ones(2, IN_FEATURES), torch.ones(OUT_FEATURES[0], 2))
    with pytest.raises(ValueError, match=r"a slot of a torch.bfloat16 stack cannot hold torch.float32; use one of "
                                         r"\['torch.bfloat16', 'torch.float16'\]"):
        stack.load(0, [pair], torch.float32)
    with pytest.raises(RuntimeError, match="slot type out of range or wider than the weights'"):
        stack.slot_types[0] = WEIGHT_TYPE_CODES[torch.float32]
        x, out = torch.randn(1, IN_FEATURES), torch.zeros(1, OUT_FEATURES[0])
        cpu_extension.load().packed_add_lora(x, stack.weights, PANEL_WIDTH, stack.ranks, stack.slot_types, out,
                                             OFFSETS[:2], segment_table([0], [1], [0], [0]),
                                             torch.zeros(1, dtype=torch.int32))


def test_compiled_op_refuses_ranks_past_a_slots_row() -> None:
    """The op reads a slot's weights at the ranks it is given: ranks that need more than the slot's row of
    weights holds are refused before any thread reads, whatever the stack's max rank was."""
    stack = PackedStack.allocate(2, 4, IN_FEATURES, OUT_FEATURES, torch.float32, "cpu")
    x, out = torch.randn(2, IN_FEATURES), torch.zeros(2, OFFSETS[-1])
    ranks = torch.full_like(stack.ranks, 4)
    ranks[1, 0] = 5  # slot 1 past its row by one rank of slice 0
    with pytest.raises(RuntimeError, match="slot 1's ranks need more weights than its row of `weights` holds"):
        cpu_extension.load().packed_add_lora(x, stack.weights, PANEL_WIDTH, ranks, stack.slot_types, out, OFFSETS,
                                             segment_table([0], [2], [0], [0]), torch.arange(2, dtype=torch.int32))
    ranks[1, 0] = 4  # every slot full to its max rank fits
    cpu_extension.load().packed_add_lora(x, stack.weights, PANEL_WIDTH, ranks, stack.slot_types, out, OFFSETS,
                                         segment_table([0], [2], [0], [0]), torch.arange(2, dtype=torch.int32))
    assert not out.any()  # zero weights add nothing


@pytest.mark.parametrize("step", ["scrambled_prefill", "long_prefill"])
def test_compiled_op_under_inference_mode(step: str) -> None:
    """As the engine calls it: under inference mode, with the output an inference tensor that the
    worker threads, running row blocks side by side, update in place."""
    generator = torch.Generator().manual_seed(2)
    token_slots = STEPS[step]
    meta = sgmv_metadata(token_slots, [max(column) or 1 for column in zip(*ALL_SLICES)])
    lora_a, lora_b = make_weights(ALL_SLICES, torch.float32, generator)
    stack = loaded_stack("compiled", ALL_SLICES, lora_a, lora_b)
    with torch.inference_mode():
        x = torch.randn(len(token_slots), IN_FEATURES, generator=generator)
        base_out = torch.randn(len(token_slots), OFFSETS[-1], generator=generator)
        expected = expected_output(x, lora_a, lora_b, ALL_SLICES, token_slots, base_out)
        compiled_add_lora(x, stack, meta, base_out, OFFSETS)
    torch.testing.assert_close(base_out.double(), expected, **TOLERANCES[torch.float32])


# Per slot, the dtype of the adapter loaded first and of the one loaded over it: the stack's own, or a
# bfloat16 slot reloaded as float32 next to a float32 one reloaded as bfloat16 (AdapterWeights.exact_dtype).
RELOAD_DTYPES = {"stack": (None, None),
                 "swapped": ([torch.bfloat16, torch.float32], [torch.float32, torch.bfloat16])}


# A SliceStack (Triton) reads every slot as its own dtype.
RELOADS = [(implementation, "stack") for implementation in IMPLEMENTATIONS] + [("reference", "swapped"),
                                                                            ("compiled", "swapped")]


@pytest.mark.parametrize(("implementation", "dtypes"), RELOADS)
def test_reloaded_slot_uses_its_new_rank_only(implementation: str, dtypes: str) -> None:
    """Slot 0 held a rank-64 adapter on all slices and is reloaded with a rank-3 one on the first
    slice only: nothing of the old adapter may remain (no stale columns, no stale slices), also when
    the reload changes the dtype a slot is read as."""
    old_dtypes, new_dtypes = RELOAD_DTYPES[dtypes]
    generator = torch.Generator().manual_seed(2)
    old, new = [[64, 8]] * 3, [[3, 8], [0, 8], [0, 8]]
    old_a, old_b = make_weights(old, torch.float32, generator)
    new_a, new_b = make_weights(new, torch.float32, generator)
    if new_dtypes:
        old_a, old_b = weights_exact_in(old_a, old_b, old_dtypes)
        new_a, new_b = weights_exact_in(new_a, new_b, new_dtypes)
    stack = stack_type(implementation).allocate(2, MAX_RANK, IN_FEATURES, OUT_FEATURES, torch.float32, "cpu")
    load_slots(stack, old, old_a, old_b, old_dtypes)
    load_slots(stack, new, new_a, new_b, new_dtypes)
    poison_unowned(stack, new, new_dtypes)
    token_slots = [0, 0, 1, 0, -1]
    meta = sgmv_metadata(token_slots, [3, 8])
    x = torch.randn(len(token_slots), IN_FEATURES, generator=generator)
    base_out = torch.randn(len(token_slots), OFFSETS[-1], generator=generator)
    expected = expected_output(x, new_a, new_b, new, token_slots, base_out)

    IMPLEMENTATIONS[implementation](x, stack, meta, base_out, OFFSETS)

    torch.testing.assert_close(base_out.double(), expected, **TOLERANCES[torch.float32])


def test_triton_launchers_take_slice_ranks_and_skip_untargeted_slices() -> None:
    """sgmv_shrink/expand with a slice-rank table leave an untargeted slice's rows exactly as they were."""
    generator = torch.Generator().manual_seed(4)
    host = [[8, 0], [0, 0], [5, 16]]
    lora_a, lora_b = make_weights(host, torch.float32, generator)
    for a, b, ranks in zip(lora_a, lora_b, host):  # poison what the slots do not own
        for slot, rank in enumerate(ranks):
            a[slot, rank:] = float("nan")
            b[slot, :, rank:] = float("nan")
    token_slots = [1, 0, 0, 1]
    meta = sgmv_metadata(token_slots, [8, 16])
    x = torch.randn(4, IN_FEATURES, generator=generator)
    shrunk = torch.full((3, 4, MAX_RANK), 2.0)
    sgmv.sgmv_shrink(x, lora_a, meta, shrunk, make_ranks(host).device)
    assert torch.equal(shrunk[1], torch.full((4, MAX_RANK), 2.0))  # no adapter targets slice 1
    assert torch.equal(shrunk[0, [0, 3]], torch.full((2, MAX_RANK), 2.0))  # slot 1 has rank 0 in slice 0
    torch.testing.assert_close(shrunk[2, 1, :5].double(), lora_a[2][0, :5].double() @ x[1].double(),
                               atol=1e-4, rtol=1e-4)


def test_compiled_op_refuses_segments_it_would_read_past() -> None:
    """A segment naming a slot or rows the stack and batch do not have is an error, never a stray read."""
    generator = torch.Generator().manual_seed(6)
    lora_a, lora_b = make_weights(ALL_SLICES, torch.float32, generator)
    stack = loaded_stack("compiled", ALL_SLICES, lora_a, lora_b)
    x, out = torch.randn(3, IN_FEATURES), torch.zeros(3, OFFSETS[-1])
    compiled = cpu_extension.load()
    for slot, first_row in ((len(ALL_SLICES[0]), 0), (0, 2)):  # a slot past the stack; two rows from row 2 of 3
        with pytest.raises(RuntimeError, match="packed_add_lora"):
            compiled.packed_add_lora(x, stack.weights, PANEL_WIDTH, stack.ranks, stack.slot_types,
                                     out, OFFSETS, segment_table([0], [2], [slot], [first_row]),
                                     torch.arange(3, dtype=torch.int32))
    for table in (segment_table([0], [2], [0], [0]).int(), torch.zeros(3, 1, dtype=torch.long)):  # int32; 3 rows
        with pytest.raises(RuntimeError, match=r"segments must be a contiguous int64 CPU tensor \[4, segments\]"):
            compiled.packed_add_lora(x, stack.weights, PANEL_WIDTH, stack.ranks, stack.slot_types,
                                     out, OFFSETS, table, torch.arange(3, dtype=torch.int32))

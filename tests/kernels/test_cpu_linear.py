"""The CPU backend's linears (kernels/cpu_linear.py): the matmul (the compiled panel matmul in column
chunks up to MAX_CHUNKED_ROWS rows, oneDNN's past them) against F.linear, and the
LoRA-wrapped linear, whose LoRA runs beside the chunked matmul, against the fp64 definition and against
the same matmul followed by the compiled add_lora (which it must equal bit for bit: one base dot
product and one LoRA sum per element, added once). The adapter mixes are test_add_lora.py's: ranks
1, 3, 48 and 64 side by side, slots on a subset of the slices or none of them, NaN in every weight
a slot does not own."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loraloom.kernels import cpu_extension, cpu_linear, packed_lora
from loraloom.kernels.lora_stacks import PackedStack
from sgmv_cases import sgmv_metadata
from test_add_lora import ALL_SLICES, IN_FEATURES, OFFSETS, STEPS, expected_output, loaded_stack, make_weights

# A loaded slot has a rank in some slice; slot 4 targets none of these slices, and is loaded at rank 1.
SLOT_RANKS = [max(column) or 1 for column in zip(*ALL_SLICES)]
# test_add_lora's steps, and one whose only adapter targets none of this linear's slices (an MLP-only
# adapter seen from qkv): the op then has no LoRA work beside the matmul.
LINEAR_STEPS = {**STEPS, "untargeted_only": [4, -1, 4, 4]}

TOLERANCE = dict(atol=1e-4, rtol=1e-4)
MATMUL_TOLERANCE = dict(atol=1e-4, rtol=1e-5)


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def torch_threads(request):
    """The ops share their work among the calling thread's torch threads; one thread runs it all in turn."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def compiled_ops() -> None:
    assert cpu_extension.load() is not None, "the CPU extension did not build (see kernels/cpu_extension.py)"


@pytest.mark.parametrize("rows", [1, 5, 32, cpu_linear.MAX_CHUNKED_ROWS, cpu_linear.MAX_CHUNKED_ROWS + 1])
@pytest.mark.parametrize("out_features", [24, 200, 1100])  # under one chunk, a partial last chunk, many chunks
def test_linear_matches_f_linear(rows: int, out_features: int, torch_threads: int) -> None:
    generator = torch.Generator().manual_seed(rows * out_features)
    x = torch.randn(rows, IN_FEATURES, generator=generator)
    weight = torch.randn(out_features, IN_FEATURES, generator=generator)
    # Each sums in its own order: a float32 rounding apart from MKL's.
    torch.testing.assert_close(cpu_linear.linear(x, weight), F.linear(x, weight), **MATMUL_TOLERANCE)


def test_chunks_give_every_thread_several(torch_threads: int) -> None:
    threads = torch_threads
    for out_features in (24, 576, 960, 3072, 49152):
        columns = cpu_linear.chunk_columns(out_features)
        assert columns % 64 == 0 and cpu_linear.MIN_CHUNK_COLUMNS <= columns <= cpu_linear.MAX_CHUNK_COLUMNS
        chunks = -(-out_features // columns)
        assert chunks >= cpu_linear.CHUNKS_PER_THREAD * threads or columns == cpu_linear.MIN_CHUNK_COLUMNS


@pytest.mark.parametrize("step", list(LINEAR_STEPS))
def test_linear_add_lora_matches_definition_and_the_two_calls(step: str, torch_threads: int) -> None:
    token_slots = LINEAR_STEPS[step]
    generator = torch.Generator().manual_seed(len(token_slots))
    lora_a, lora_b = make_weights(ALL_SLICES, torch.float32, generator)
    stack = loaded_stack("compiled", ALL_SLICES, lora_a, lora_b)
    meta = sgmv_metadata(token_slots, SLOT_RANKS)
    x = torch.randn(len(token_slots), IN_FEATURES, generator=generator)
    weight = torch.randn(OFFSETS[-1], IN_FEATURES, generator=generator)

    out = cpu_linear.linear_add_lora(x, weight, stack, meta, OFFSETS)

    expected = expected_output(x, lora_a, lora_b, ALL_SLICES, token_slots, F.linear(x, weight))
    torch.testing.assert_close(out.double(), expected, **TOLERANCE)
    two_calls = cpu_linear.linear(x, weight)
    packed_lora.add_lora(x, stack, meta, two_calls, OFFSETS)
    assert torch.equal(out, two_calls)


@pytest.mark.parametrize("out_features", [1100, 3072])  # a partial last chunk; a gate_up-wide linear
def test_linear_add_lora_over_many_chunks(out_features: int, torch_threads: int) -> None:
    """Beside a LoRA the matmul's last chunks are narrower than the rest (csrc/overlapped_linear.cpp
    ColumnChunks, tapered); every column must still get its base product and its LoRA sum once."""
    ranks = [1, 16, 64, 5]
    generator = torch.Generator().manual_seed(out_features)
    stack = PackedStack.allocate(len(ranks), max(ranks), IN_FEATURES, [out_features], torch.float32, "cpu")
    weights = [(torch.randn(rank, IN_FEATURES, generator=generator) / IN_FEATURES ** 0.5,
                torch.randn(out_features, rank, generator=generator) / 8) for rank in ranks]
    for slot, (a, b) in enumerate(weights):
        stack.load(slot, [(a, b)])
    token_slots = [0, 1, 2, 3, -1, 2, 2]
    meta = sgmv_metadata(token_slots, ranks)
    x = torch.randn(len(token_slots), IN_FEATURES, generator=generator)
    weight = torch.randn(out_features, IN_FEATURES, generator=generator)

    out = cpu_linear.linear_add_lora(x, weight, stack, meta, [0, out_features])

    expected = F.linear(x, weight).double()
    for row, slot in enumerate(token_slots):
        if slot >= 0:
            a, b = weights[slot]
            expected[row] += b.double() @ (a.double() @ x[row].double())
    torch.testing.assert_close(out.double(), expected, **TOLERANCE)
    two_calls = cpu_linear.linear(x, weight)
    packed_lora.add_lora(x, stack, meta, two_calls, [0, out_features])
    assert torch.equal(out, two_calls)


@pytest.mark.parametrize("torch_threads", [2], indirect=True)
@pytest.mark.parametrize("step", ["decode", "scrambled"])
def test_linear_add_lora_under_inference_mode(step: str, torch_threads: int) -> None:
    """The engine steps under inference mode; the matmul's chunks run torch ops on the op's own threads,
    which must take the caller's mode (an inference tensor written outside it is an error)."""
    token_slots = STEPS[step]
    generator = torch.Generator().manual_seed(9)
    lora_a, lora_b = make_weights(ALL_SLICES, torch.float32, generator)
    stack = loaded_stack("compiled", ALL_SLICES, lora_a, lora_b)
    with torch.inference_mode():
        meta = sgmv_metadata(token_slots, SLOT_RANKS)
        x = torch.randn(len(token_slots), IN_FEATURES, generator=generator)
        weight = torch.randn(OFFSETS[-1], IN_FEATURES, generator=generator)
        out = cpu_linear.linear_add_lora(x, weight, stack, meta, OFFSETS)
        base = cpu_linear.linear(x, weight)
    expected = expected_output(x, lora_a, lora_b, ALL_SLICES, token_slots, F.linear(x, weight))
    torch.testing.assert_close(out.double(), expected, **TOLERANCE)
    torch.testing.assert_close(base, F.linear(x, weight), **MATMUL_TOLERANCE)


def test_compiled_linear_refuses_mismatched_shapes() -> None:
    compiled = cpu_extension.load()
    x, packed = torch.randn(3, 8), cpu_linear.packed_weight(torch.randn(40, 8))  # two panels
    compiled.chunked_linear(x, packed, torch.empty(3, 40), 64)  # the shapes that agree
    with pytest.raises(RuntimeError, match="packed_weight"):
        compiled.chunked_linear(x, packed, torch.empty(3, 70), 64)  # out needs three panels
    with pytest.raises(RuntimeError, match="packed_weight"):
        compiled.chunked_linear(torch.randn(3, 9), packed, torch.empty(3, 40), 64)  # in features disagree
    with pytest.raises(RuntimeError, match="packed_weight"):
        compiled.chunked_linear(x, packed.transpose(1, 2), torch.empty(3, 40), 64)
    with pytest.raises(RuntimeError, match="x's rows"):
        compiled.chunked_linear(x, packed, torch.empty(4, 40), 64)
    for columns in (0, 48):
        with pytest.raises(RuntimeError, match="chunk_columns"):
            compiled.chunked_linear(x, packed, torch.empty(3, 40), columns)
    with pytest.raises(RuntimeError, match="float32"):
        compiled.chunked_linear(x.double(), packed, torch.empty(3, 40), 64)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 17, 64])  # every tile height, and tiles after tiles
@pytest.mark.parametrize("shape", [(24, 37), (200, 200), (1100, 64)])  # (out, in): a part panel, odd in, many chunks
def test_the_panel_matmul_against_the_float64_product(rows: int, shape: tuple[int, int], torch_threads: int) -> None:
    out_features, in_features = shape
    generator = torch.Generator().manual_seed(rows * out_features + in_features)
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(out_features, in_features, generator=generator)
    expected = x.double() @ weight.double().t()
    torch.testing.assert_close(cpu_linear.linear(x, weight).double(), expected, **MATMUL_TOLERANCE)
    # x with a row stride of its own (a slice of a wider tensor) reads the same rows.
    wide = torch.randn(rows, in_features + 5, generator=generator)
    wide[:, :in_features] = x
    torch.testing.assert_close(cpu_linear.linear(wide[:, :in_features], weight).double(), expected,
                               **MATMUL_TOLERANCE)


def test_the_packed_weight_is_in_panels_with_zeros_past_the_last_column() -> None:
    weight = torch.randn(100, 64)
    packed = cpu_linear.packed_weight(weight)
    assert packed.shape == (4, 64, 32)
    assert torch.equal(packed[1, :, 7], weight[32 + 7])  # panel 1, column 7: output column 39, all of `in`
    assert torch.equal(packed[3, :, :4].t(), weight[96:]) and torch.all(packed[3, :, 4:] == 0)


def test_an_inference_weight_keeps_torchs_matmul() -> None:
    """No version counter to see a change by, so no packed copy: F.linear's own bits."""
    with torch.inference_mode():
        weight = torch.randn(70, 16)
    x = torch.randn(4, 16)
    assert torch.equal(cpu_linear.linear(x, weight), F.linear(x, weight))

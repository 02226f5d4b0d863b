"""kernels/huge_pages.py: zeros on 2 MiB-aligned memory that Linux backs with huge pages where it may."""
from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from loraloom.kernels import huge_pages
from loraloom.kernels.lora_stacks import PackedStack

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str | None:
    """The selected mode ([always], [madvise] or [never]), None without THP."""
    if not THP_MODE.exists():
        return None
    return THP_MODE.read_text().split("[")[1].split("]")[0]


def huge_kib_of_mapping(address: int) -> int:
    """AnonHugePages of the mapping that holds `address`, from /proc/self/smaps."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            inside = start <= address < end
        elif inside and fields[0] == "AnonHugePages:":
            return int(fields[1])
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_zeros_start_on_a_huge_page_and_behave_like_torch_zeros(dtype: torch.dtype) -> None:
    shape = (3, 5, huge_pages.MIN_BYTES // dtype.itemsize // 8)
    tensor = huge_pages.zeros(shape, dtype)
    assert tensor.shape == shape and tensor.dtype == dtype and tensor.is_contiguous()
    assert tensor.data_ptr() % huge_pages.HUGE_PAGE_BYTES == 0
    assert torch.equal(tensor, torch.zeros(shape, dtype=dtype))
    tensor[1, 2].fill_(1.5)
    gc.collect()  # the tensor alone keeps its memory alive
    assert tensor.sum().item() == 1.5 * shape[2]
    assert torch.equal(tensor[1, 2].clone(), torch.full((shape[2],), 1.5, dtype=dtype))


def test_small_zeros_are_plain_torch_zeros() -> None:
    tensor = huge_pages.zeros((4, 16), torch.float32)
    assert tensor.shape == (4, 16) and torch.equal(tensor, torch.zeros(4, 16))


@pytest.mark.skipif(thp_mode() in (None, "never"), reason="this kernel has transparent huge pages off")
def test_written_memory_is_backed_by_huge_pages() -> None:
    tensor = huge_pages.zeros((huge_pages.MIN_BYTES // 4,), torch.float32)
    tensor.fill_(1.0)
    assert huge_kib_of_mapping(tensor.data_ptr()) >= huge_pages.HUGE_PAGE_BYTES // 1024


def test_a_cpu_packed_stack_lives_on_huge_page_aligned_memory() -> None:
    stack = PackedStack.allocate(num_slots=16, max_rank=64, in_features=1024, out_features=[2048, 4096],
                                 dtype=torch.float32, device="cpu")
    for tensor in stack.tensors():
        assert tensor.data_ptr() % huge_pages.HUGE_PAGE_BYTES == 0
        assert not tensor.any()

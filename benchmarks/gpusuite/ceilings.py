"""The device's own limits, measured in the same run as everything they bound.

- copy bandwidth: a large device-to-device copy, counting the bytes read and written;
- host-to-device bandwidth from pinned memory (CUDA only): the bound of an adapter's slot load;
- matrix rate in the engine dtype (BF16 on the GPU), and in FP8 through torch._scaled_mm where
  the device has FP8 GEMMs.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gpusuite.table import Row
from loraloom.kernels.dtypes import FP8_DTYPE
from loraloom.kernels.fp8 import fp8_gemm_available

GB = 1e9
TFLOP = 1e12
HOST_TO_DEVICE_BYTES = 1 << 28


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(fn: Callable[[], object], device: torch.device, calls: int) -> float:
    """Mean time of `calls` back-to-back calls after one warm-up call (which also compiles Triton kernels)."""
    fn()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / calls


@dataclass(frozen=True)
class Ceilings:
    copy_bandwidth: float  # bytes/s read + written by a device-to-device copy
    host_to_device_bandwidth: float | None  # bytes/s from pinned host memory; None off CUDA
    matmul_rate: float  # FLOP/s of an n x n x n matmul in the engine dtype
    matmul_dtype: torch.dtype
    fp8_matmul_rate: float | None  # FLOP/s through torch._scaled_mm; None without FP8 GEMMs

    def rows(self) -> list[Row]:
        rows = [Row("ceiling: device copy bandwidth (read + write)", self.copy_bandwidth / GB, "GB/s")]
        if self.host_to_device_bandwidth is not None:
            rows.append(Row("ceiling: host -> device copy (pinned)", self.host_to_device_bandwidth / GB, "GB/s"))
        dtype_name = str(self.matmul_dtype).removeprefix("torch.")
        rows.append(Row(f"ceiling: matmul rate {dtype_name}", self.matmul_rate / TFLOP, "TFLOP/s"))
        if self.fp8_matmul_rate is not None:
            rows.append(Row("ceiling: matmul rate fp8 e4m3 (_scaled_mm)", self.fp8_matmul_rate / TFLOP, "TFLOP/s"))
        return rows


def measure_ceilings(device: torch.device, dtype: torch.dtype, copy_bytes: int, matmul_size: int) -> Ceilings:
    calls = 10 if device.type == "cuda" else 3
    return Ceilings(
        copy_bandwidth=_copy_bandwidth(device, copy_bytes, calls),
        host_to_device_bandwidth=_host_to_device_bandwidth(device) if device.type == "cuda" else None,
        matmul_rate=_matmul_rate(device, dtype, matmul_size, calls),
        matmul_dtype=dtype,
        fp8_matmul_rate=_fp8_matmul_rate(device, matmul_size, calls),
    )


def _copy_bandwidth(device: torch.device, copy_bytes: int, calls: int) -> float:
    source = torch.empty(copy_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    target = torch.empty_like(source)
    return 2 * copy_bytes / seconds_per_call(lambda: target.copy_(source), device, calls)


def _matmul_rate(device: torch.device, dtype: torch.dtype, n: int, calls: int) -> float:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return 2 * n ** 3 / seconds_per_call(lambda: a @ b, device, calls)


def _host_to_device_bandwidth(device: torch.device) -> float:
    host = torch.empty(HOST_TO_DEVICE_BYTES, dtype=torch.uint8, pin_memory=True)
    target = torch.empty(HOST_TO_DEVICE_BYTES, dtype=torch.uint8, device=device)
    return HOST_TO_DEVICE_BYTES / seconds_per_call(lambda: target.copy_(host, non_blocking=True), device, 5)


def _fp8_matmul_rate(device: torch.device, n: int, calls: int) -> float | None:
    if device.type != "cuda" or not fp8_gemm_available(device.index):
        return None
    a = torch.randn(n, n, device=device).to(FP8_DTYPE)
    b = torch.randn(n, n, device=device).to(FP8_DTYPE)  # row-major [N, K]: b.t() is the column-major operand
    one = torch.ones((), dtype=torch.float32, device=device)
    seconds = seconds_per_call(
        lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), device, calls
    )
    return 2 * n ** 3 / seconds

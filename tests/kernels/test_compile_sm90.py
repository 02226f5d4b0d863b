"""Every kernel specialization the launchers produce compiles for an H100 (see sm90_compile.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("sm90_compile.py")
KERNELS = ["_sgmv_shrink_kernel", "_sgmv_shrink_reduce_kernel", "_sgmv_expand_kernel",
           "_write_kv_cache_kernel", "_paged_attention_kernel", "_paged_decode_kernel",
           "_paged_decode_combine_kernel", "_rms_norm_kernel", "_rotary_write_kv_cache_kernel",
           "_quantize_per_token_kernel", "_two_term_rows_kernel", "_fp8_small_m_kernel",
           "_fp8_split_k_reduce_kernel"]


def test_kernels_compile_for_sm90(tmp_path: Path) -> None:
    pytest.importorskip("triton.backends.nvidia", reason="this Triton build has no NVIDIA backend")
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compile for real, not from an earlier run's cache
    result = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True)

    assert result.returncode == 0, f"sm_90 compilation failed:\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
    compiled = [line.split()[0] for line in result.stdout.splitlines()]
    for kernel in KERNELS:
        assert kernel in compiled, f"{kernel} was never compiled; the script printed:\n{result.stdout}"
    # Two dtypes x (SGMV: shrink direct, shrink split + reduce, expand = 4; attention: kv write,
    # rotary write, prefill, decode, split decode + combine = 6, once with a cache in the activation
    # dtype and once with an FP8 cache = 12; rms_norm + fused add = 2; FP8: the per-token
    # quantization (dynamic, static, quantize-first launches), the two-term rows, and the small-M GEMM
    # with its split-K reduce over the o_proj / gate_up configs = 17), plus group-3 attention (6).
    assert len(compiled) == 2 * (4 + 12 + 2 + 17) + 6

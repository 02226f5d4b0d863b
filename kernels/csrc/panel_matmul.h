// The CPU linears' matmul for decode-shaped inputs: out[:, columns] = x @ W[columns].T over W packed once
// into panels of 32 output columns (kernels/cpu_linear.py packed_weight: [ceil(out / 32), in, 32], each
// panel's `in` rows of 32 weights one after another, zeros past the last column).
//
// Why our own: torch's matmul calls MKL, which runs its AVX2 kernels on AMD CPUs even where they have
// AVX-512 (`perf` on a 2-core EPYC, Zen 5: mkl_blas_def_sgemm_kernel_0_zen, ymm registers). This loop,
// nothing more than rows x 32 columns of sums kept in vector registers while a panel streams past once per
// tile of rows, ran the bundled model's decode shapes 2.4-3.2x faster than MKL on one thread with the
// weights coming from memory (benchmarks/cpu_gemm_probe.py), and a whole decode step faster at every batch.
//
// With AVX-512 a tile is up to 8 rows: 16 vector sums plus two panel vectors and a broadcast fit in the 32
// registers. With AVX2 (Float16x is then two registers) a tile is up to 4 rows, for the same reason with 16.
// Each output element is one float32 sum over `in`, multiply-adds in order of k, whatever the tile.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "vector_ops.h"

namespace loraloom {

constexpr int64_t kPanelColumns = 32;  // kernels/cpu_linear.py PACKED_PANEL_COLUMNS
#if defined(__AVX512F__)
constexpr int kMaxTileRows = 8;
#else
constexpr int kMaxTileRows = 4;
#endif

// kRows rows of x against one panel; `columns` (<= 32) of the panel's columns are written to out.
template <int kRows>
inline void panel_tile(const float* __restrict x, int64_t x_stride, int64_t in_features, const float* __restrict panel,
                       float* __restrict out, int64_t out_stride, int64_t columns) {
  Float16x acc[kRows][2] = {};
  for (int64_t k = 0; k < in_features; ++k) {
    const Float16x w0 = load16(panel + k * kPanelColumns), w1 = load16(panel + k * kPanelColumns + 16);
    for (int r = 0; r < kRows; ++r) {
      const Float16x xk = Float16x{} + x[r * x_stride + k];  // the row's x[k] in every lane
      acc[r][0] = fma16(xk, w0, acc[r][0]);
      acc[r][1] = fma16(xk, w1, acc[r][1]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    float* row_out = out + r * out_stride;
    if (columns == kPanelColumns) {
      store16(row_out, acc[r][0]);
      store16(row_out + 16, acc[r][1]);
    } else {  // the last panel of a linear whose width is not a multiple of 32
      alignas(64) float sums[kPanelColumns];
      store16(sums, acc[r][0]);
      store16(sums + 16, acc[r][1]);
      std::memcpy(row_out, sums, static_cast<size_t>(columns) * sizeof(float));
    }
  }
}

// out[:, first:first + width] = x @ W[first:first + width].T on the calling thread; first is a multiple of 32.
// x [T, in] with contiguous rows, packed [ceil(out / 32), in, 32], out [T, out] contiguous (checked by the caller).
inline void panel_matmul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& out, int64_t first,
                         int64_t width) {
  const int64_t rows = x.size(0), in_features = x.size(1), x_stride = x.stride(0), out_features = out.size(1);
  const float* x_data = x.data_ptr<float>();
  const float* panels = packed.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  for (int64_t column = first; column < first + width; column += kPanelColumns) {
    const float* panel = panels + (column / kPanelColumns) * in_features * kPanelColumns;
    const int64_t columns = std::min(kPanelColumns, first + width - column);
    for (int64_t row = 0; row < rows; row += kMaxTileRows) {
      with_constant_count<kMaxTileRows>(std::min<int64_t>(kMaxTileRows, rows - row), [&](auto tile_rows) {
        panel_tile<decltype(tile_rows)::value>(x_data + row * x_stride, x_stride, in_features, panel,
                                               out_data + row * out_features + column, out_features, columns);
      });
    }
  }
}

}  // namespace loraloom

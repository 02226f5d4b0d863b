// Small vector loops shared by the compiled CPU ops, written so the compiler vectorizes them
// (built with -O3 -march=native; `omp simd` lets it reorder the sum in dot).
#pragma once

#include <cstdint>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace loraloom {

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// Sixteen floats as one value: an AVX-512 register, or two AVX2 ones (GCC's vector extension, so the
// code below names no instruction set and builds wherever -march=native points).
using Float16x = float __attribute__((vector_size(64)));

inline Float16x load16(const float* p) {
  Float16x v;
  __builtin_memcpy(&v, p, sizeof v);  // an unaligned load
  return v;
}

inline float sum16(Float16x v) {
  float acc = 0.f;
  for (int i = 0; i < 16; ++i) acc += v[i];
  return acc;
}

// out[r] = dot(w, xs[r]) for kRows rows at once, over long rows (a LoRA weight row, hundreds to
// thousands of floats): w is loaded once for every x row, and each row keeps two running vector
// sums, so the loop waits neither on memory twice nor on one chain of adds.
template <int kRows>
inline void dot_rows(const float* __restrict w, const float* const* xs, int64_t n, float* out) {
  Float16x acc[kRows][2] = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const Float16x w0 = load16(w + i), w1 = load16(w + i + 16);
    for (int r = 0; r < kRows; ++r) {
      acc[r][0] += w0 * load16(xs[r] + i);
      acc[r][1] += w1 * load16(xs[r] + i + 16);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    float total = sum16(acc[r][0] + acc[r][1]);
    for (int64_t j = i; j < n; ++j) total += w[j] * xs[r][j];
    out[r] = total;
  }
}

// out[i] += c * b[i]
inline void axpy(float* __restrict out, const float* __restrict b, float c, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] += c * b[i];
}

// The bit layouts of torch's bfloat16 and float16 (at::BFloat16 and at::Half hold exactly these 16
// bits), as types of their own so that each widens its own way and these loops need no ATen header.
struct Bf16 {
  uint16_t bits;
};
struct Fp16 {
  uint16_t bits;
};

// Widening is exact for both. The float loops above then run on the widened copy: GCC vectorizes a
// widening load inside a reduction poorly and float16 conversion not at all, so it is a loop of its own.
// bfloat16 is the top half of a float32: one shift.
inline void widen(const Bf16* __restrict in, float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = __builtin_bit_cast(float, static_cast<uint32_t>(in[i].bits) << 16);
}

// float16: F16C converts eight at a time.
inline void widen(const Fp16* __restrict in, float* __restrict out, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
#endif
  for (; i < n; ++i) out[i] = static_cast<float>(__builtin_bit_cast(_Float16, in[i].bits));
}

}  // namespace loraloom

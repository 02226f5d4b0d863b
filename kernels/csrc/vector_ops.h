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

// out[j] = dot(rows[j], x) for four rows at once: four independent sums hide the add latency that
// one running sum waits on, and x is loaded once for the four.
inline void dot4(const float* __restrict r0, const float* __restrict r1, const float* __restrict r2,
                 const float* __restrict r3, const float* __restrict x, int64_t n, float* out) {
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
  for (int64_t i = 0; i < n; ++i) {
    a0 += r0[i] * x[i];
    a1 += r1[i] * x[i];
    a2 += r2[i] * x[i];
    a3 += r3[i] * x[i];
  }
  out[0] = a0;
  out[1] = a1;
  out[2] = a2;
  out[3] = a3;
}

// out[i] += c * b[i]
inline void axpy(float* __restrict out, const float* __restrict b, float c, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] += c * b[i];
}

// out[i] += sum_j coef[j] * b_j[i] for four rows at once: out is read and written once per four rows.
inline void axpy4(float* __restrict out, const float* __restrict b0, const float* __restrict b1,
                  const float* __restrict b2, const float* __restrict b3, const float* coef, int64_t n) {
  const float c0 = coef[0], c1 = coef[1], c2 = coef[2], c3 = coef[3];
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] += c0 * b0[i] + c1 * b1[i] + c2 * b2[i] + c3 * b3[i];
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

// Small vector loops shared by the compiled CPU ops, written so the compiler vectorizes them
// (built with -O3 -march=native; `omp simd` lets it reorder the sum in dot).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__F16C__) || defined(__FMA__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace loraloom {

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
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

// One weight as float32. Widening is exact for both 16-bit types; bfloat16 is the top half of a
// float32 (one shift).
inline float widen1(float v) { return v; }
inline float widen1(Bf16 v) { return __builtin_bit_cast(float, static_cast<uint32_t>(v.bits) << 16); }
inline float widen1(Fp16 v) { return static_cast<float>(__builtin_bit_cast(_Float16, v.bits)); }

// Sixteen floats as one value: an AVX-512 register, or two AVX2 ones (GCC's vector extension, so the
// code below names no instruction set and builds wherever -march=native points).
using Float16x = float __attribute__((vector_size(64)));

// Sixteen weights from p (unaligned), widened to float32 in registers: a 16-bit decode step reads
// half the bytes and converts them where they are used, with no widened copy in between.
inline Float16x load16(const float* p) {
  Float16x v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

// bfloat16: with AVX-512, one widening load and one shift. GCC splits its own conversion of the vector
// into two 256-bit halves and a merge (it prefers 256-bit vectors on Intel targets): 3% slower on a
// 32-adapter decode step of bfloat16 slots, measured on a 2-core Xeon.
inline Float16x load16(const Bf16* p) {
  Float16x v;
#if defined(__AVX512F__)
  const __m512i words = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
  __builtin_memcpy(&v, &words, sizeof v);
#else
  using Half16x = uint16_t __attribute__((vector_size(32)));
  using Word16x = uint32_t __attribute__((vector_size(64)));
  Half16x bits;
  __builtin_memcpy(&bits, p, sizeof bits);
  const Word16x words = __builtin_convertvector(bits, Word16x) << 16;
  __builtin_memcpy(&v, &words, sizeof v);
#endif
  return v;
}

// float16: GCC's own conversion of a vector goes one lane at a time, so the F16C / AVX-512 instructions.
inline Float16x load16(const Fp16* p) {
  Float16x v;
#if defined(__AVX512F__)
  const __m512 wide = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  __builtin_memcpy(&v, &wide, sizeof v);
#elif defined(__F16C__)
  const __m256 low = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256 high = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  __builtin_memcpy(&v, &low, sizeof low);
  __builtin_memcpy(reinterpret_cast<char*>(&v) + sizeof low, &high, sizeof high);
#else
  for (int i = 0; i < 16; ++i) v[i] = widen1(p[i]);
#endif
  return v;
}

// How far ahead of the loads the weight loops ask for cache lines. The hardware prefetchers
// alone left a core stalled on memory: a slot's weights are many short streams (each slice's A
// rows, each B panel), and every new stream starts cold. Measured on a 2-core Xeon (Sapphire
// Rapids class), 32-adapter decode step: 2 KiB 0.90 of the op's time without, 4 KiB 0.88, 8 KiB 0.92.
constexpr int64_t kPrefetchBytes = 4096;

// The lines are asked for into L2 (prefetcht2), not L1 (prefetcht0): a request to L1 holds one of the
// core's few L1 miss buffers until memory answers, which capped one thread near 17 GB/s where a plain
// sequential read gets 28. Measured on a 2-core EPYC (Zen 4), same process, 32-adapter decode step's
// op: one thread 26.1 -> 22.2 ms, two threads 15.3 -> 13.2 ms; in an engine decode step at batch 32,
// the LoRA's cost 17.2 -> 13.3 ms. 8 and 16 KiB ahead were no better into L2 either.
constexpr int kPrefetchLocality = 1;  // __builtin_prefetch's locality argument: 1 is prefetcht2 on x86

// A run of weights read front to back: one slot's weights for one linear, its A rows and then its B
// panels (kernels/lora_stacks.py PackedStack). Prefetching stops at the run's end, so it never asks for
// memory nobody reads (the zero padding past a slot's ranks, another slot's weights). Prefetching a fixed
// distance past every run's end wasted ~4 KiB of reads per run: ~50 MB a 32-adapter decode step,
// 11% of its float32 weights and 22% of bfloat16 ones, when each slice's B was a run of its own.
struct Stream {
  const char* end;
};

// Asks for the `bytes` bytes that lie kPrefetchBytes past p (one request per cache line), within `stream`.
inline void prefetch_ahead(const void* p, int64_t bytes, const Stream& stream) {
  const char* ahead = static_cast<const char*>(p) + kPrefetchBytes;
  for (int64_t line = 0; line < bytes; line += 64) {
    if (ahead + line >= stream.end) return;
    __builtin_prefetch(ahead + line, 0, kPrefetchLocality);
  }
}

// acc + a * b, rounded once where the machine has FMA. Written out rather than left to the compiler:
// GCC contracts a * b + acc into an FMA or not per template instance, and on a Cooper Lake build the
// float32 and 16-bit instances of the loops below came out differently, so a bfloat16 or float16 slot
// no longer summed exactly what a float32 slot of the same values does (tests/kernels/test_add_lora.py).
inline Float16x fma16(Float16x a, Float16x b, Float16x acc) {
#if defined(__AVX512F__)
  __m512 va, vb, vc;
  __builtin_memcpy(&va, &a, sizeof a);
  __builtin_memcpy(&vb, &b, sizeof b);
  __builtin_memcpy(&vc, &acc, sizeof acc);
  const __m512 sum = _mm512_fmadd_ps(va, vb, vc);
  __builtin_memcpy(&acc, &sum, sizeof acc);
  return acc;
#elif defined(__FMA__)
  __m256 va[2], vb[2], vc[2];
  __builtin_memcpy(va, &a, sizeof a);
  __builtin_memcpy(vb, &b, sizeof b);
  __builtin_memcpy(vc, &acc, sizeof acc);
  for (int half = 0; half < 2; ++half) vc[half] = _mm256_fmadd_ps(va[half], vb[half], vc[half]);
  __builtin_memcpy(&acc, vc, sizeof acc);
  return acc;
#else
  return a * b + acc;  // no FMA to contract into: two roundings in every instance alike
#endif
}

// The same for one float (the loops' short tails).
inline float fma1(float a, float b, float acc) {
#if defined(__FMA__)
  return std::fma(a, b, acc);
#else
  return a * b + acc;
#endif
}

// f(std::integral_constant<int, count>{}) for a count of 1 to kMax (the callers' counts are in that range),
// so that a loop gets its number of rows as a constant and keeps each row's sums in registers.
template <int kMax, typename F>
inline void with_constant_count(int64_t count, const F& f) {
  if constexpr (kMax > 1) {
    if (count < kMax) return with_constant_count<kMax - 1>(count, f);
  }
  f(std::integral_constant<int, kMax>{});
}

inline void store16(float* p, Float16x v) { __builtin_memcpy(p, &v, sizeof v); }

// The sixteen lanes' sum as a tree of halves: four dependent adds where a lane-by-lane sum is sixteen.
inline float sum16(Float16x v) {
  using Float8x = float __attribute__((vector_size(32)));
  using Float4x = float __attribute__((vector_size(16)));
  const Float8x eight = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                        __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const Float4x four = __builtin_shufflevector(eight, eight, 0, 1, 2, 3) + __builtin_shufflevector(eight, eight, 4, 5, 6, 7);
  return (four[0] + four[2]) + (four[1] + four[3]);
}

// out[r] = dot(w, xs[r]) for kRows rows at once, over long rows (a LoRA weight row, hundreds to
// thousands of weights of type W): w is loaded once for every x row.
//
// Each row keeps kChains running vector sums, so the loop is not held to one multiply-add per chain per
// multiply-add latency (a decode step's shrink is one row against each A row), and the lanes are summed as
// a tree. Prefill segments (many rows per adapter) are bound by those chains, so they gain; one row per
// adapter is bound by memory either way.
template <int kRows, typename W>
inline void dot_rows(const W* __restrict w, const float* const* xs, int64_t n, float* out, const Stream& stream) {
#if defined(__AVX512F__)
  constexpr int kChains = kRows <= 2 ? 4 : 2;
#else  // 16 registers, and a Float16x takes two: more sums than this would spill
  constexpr int kChains = kRows == 1 ? 4 : 2;
#endif
  constexpr int64_t kStep = 16 * kChains;
  Float16x acc[kRows][kChains] = {};
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    prefetch_ahead(w + i, kStep * sizeof(W), stream);
    Float16x wv[kChains];
    for (int c = 0; c < kChains; ++c) wv[c] = load16(w + i + 16 * c);
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < kChains; ++c) acc[r][c] = fma16(wv[c], load16(xs[r] + i + 16 * c), acc[r][c]);
  }
  for (; i + 16 <= n; i += 16) {  // whole vectors past the last full step, into the first chain
    const Float16x wv = load16(w + i);
    for (int r = 0; r < kRows; ++r) acc[r][0] = fma16(wv, load16(xs[r] + i), acc[r][0]);
  }
  for (int r = 0; r < kRows; ++r) {
    Float16x chains = acc[r][0];
    for (int c = 1; c < kChains; ++c) chains += acc[r][c];
    float total = sum16(chains);
    for (int64_t j = i; j < n; ++j) total = fma1(widen1(w[j]), xs[r][j], total);
    out[r] = total;
  }
}

}  // namespace loraloom

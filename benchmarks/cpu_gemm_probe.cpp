// A probe, not a kernel the engine uses: a plain AVX-512 matmul for decode-shaped inputs, and the same
// matmul with a stream of other bytes (standing for a LoRA's weights) prefetched from inside its loop.
// benchmarks/cpu_gemm_probe.py builds it and compares it with torch's matmul (MKL) and oneDNN; the
// conclusion for the CPU path is in BENCHMARKS.md (why batch 32 sits near 0.90 on two cores).
//
// The matmul: out [M, N] = x [M, K] @ W.T, W packed once into panels of 32 output columns ([N/32, K, 32],
// each panel's K rows of 32 weights one after another) and x transposed ([K, M]). A tile is 8 rows by one
// panel: 16 vector sums in registers, and each k step loads two vectors of the panel and broadcasts 8 x values.
// Needs M a multiple of 8 and N of 32 (the probe's shapes are); no tails.
#include <torch/extension.h>
#include <immintrin.h>

#include <chrono>

namespace {

constexpr int64_t kPanel = 32;  // output columns per packed panel: two 16-float vectors
constexpr int kTileRows = 8;

// A line is asked for into L2 each time `credit` passes 16; credit grows by `lines_per_16_steps` a k step.
struct PrefetchStream {
  const char* next;
  const char* end;
  int64_t lines_per_16_steps;
  int64_t credit = 0;

  void step() {
    credit += lines_per_16_steps;
    while (credit >= 16 && next < end) {
      _mm_prefetch(next, _MM_HINT_T2);
      next += 64;
      credit -= 16;
    }
  }
};

void tile(const float* __restrict xt, int64_t m_total, int64_t m0, const float* __restrict panel, int64_t k_total,
          float* __restrict out, int64_t n_total, int64_t n0, PrefetchStream* stream) {
  __m512 acc[kTileRows][2];
  for (int r = 0; r < kTileRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < k_total; ++k) {
    const __m512 w0 = _mm512_loadu_ps(panel + k * kPanel), w1 = _mm512_loadu_ps(panel + k * kPanel + 16);
    const float* xk = xt + k * m_total + m0;
    if (stream != nullptr) stream->step();
    for (int r = 0; r < kTileRows; ++r) {
      const __m512 xv = _mm512_set1_ps(xk[r]);
      acc[r][0] = _mm512_fmadd_ps(xv, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xv, w1, acc[r][1]);
    }
  }
  for (int r = 0; r < kTileRows; ++r) {
    _mm512_storeu_ps(out + (m0 + r) * n_total + n0, acc[r][0]);
    _mm512_storeu_ps(out + (m0 + r) * n_total + n0 + 16, acc[r][1]);
  }
}

// The sum of [begin, end): a read of the stream's bytes (from L2 when they were prefetched).
float read_bytes(const char* begin, const char* end) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  for (const char* p = begin; p + 128 <= end; p += 128) {
    s0 = _mm512_add_ps(s0, _mm512_loadu_ps(reinterpret_cast<const float*>(p)));
    s1 = _mm512_add_ps(s1, _mm512_loadu_ps(reinterpret_cast<const float*>(p + 64)));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

volatile float g_sink;  // keeps the reads of the stream from being optimized away

}  // namespace

// [N, K] -> [N / 32, K, 32]
torch::Tensor pack_weight(const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) % kPanel == 0 && weight.scalar_type() == at::kFloat,
              "pack_weight: a float32 [N, K] weight with N a multiple of 32");
  return weight.view({weight.size(0) / kPanel, kPanel, weight.size(1)}).transpose(1, 2).contiguous();
}

// out = x @ W.T on one thread; returns seconds. stream_bytes_per_weight_byte: 0 reads nothing else; r > 0 also
// reads r bytes of `stream` per weight byte, after each panel; interleaved: those bytes are prefetched from
// inside the panel's loop first (so the read after it finds them in L2), else read cold.
double probe_matmul(const torch::Tensor& xt, const torch::Tensor& packed, const torch::Tensor& out,
                    const torch::Tensor& stream, double stream_bytes_per_weight_byte, bool interleaved) {
  const int64_t panels = packed.size(0), k_total = packed.size(1), m_total = xt.size(1);
  TORCH_CHECK(xt.size(0) == k_total && m_total % kTileRows == 0 && out.is_contiguous() &&
                  out.size(0) == m_total && out.size(1) == panels * kPanel,
              "probe_matmul: xt [K, M] with M a multiple of 8, packed [N/32, K, 32], out [M, N]");
  const float* x = xt.data_ptr<float>();
  const float* w = packed.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const char* stream_begin = static_cast<const char*>(stream.data_ptr());
  const char* stream_end = stream_begin + stream.nbytes();
  // Lines per panel: the panel's weight bytes times the ratio; spread over its (M / 8) x K k steps.
  const int64_t panel_lines = static_cast<int64_t>(k_total * kPanel * 4 * stream_bytes_per_weight_byte / 64);
  const int64_t steps = (m_total / kTileRows) * k_total;
  const int64_t lines_per_16_steps = steps > 0 ? (16 * panel_lines + steps - 1) / steps : 0;
  const char* cursor = stream_begin;
  float sum = 0.f;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t p = 0; p < panels; ++p) {
    if (cursor + panel_lines * 64 > stream_end) cursor = stream_begin;
    PrefetchStream prefetch{cursor, cursor + panel_lines * 64, lines_per_16_steps};
    for (int64_t m0 = 0; m0 < m_total; m0 += kTileRows)
      tile(x, m_total, m0, w + p * k_total * kPanel, k_total, o, panels * kPanel, p * kPanel,
           interleaved && panel_lines > 0 ? &prefetch : nullptr);
    if (panel_lines > 0) sum += read_bytes(cursor, cursor + panel_lines * 64);
    cursor += panel_lines * 64;
  }
  g_sink = sum;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack_weight", &pack_weight);
  m.def("probe_matmul", &probe_matmul);
}

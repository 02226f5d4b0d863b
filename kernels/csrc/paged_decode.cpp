// Decode attention for the CPU: each one-token request attends its cached sequence, read in place
// through its block table.
//
// The plain-torch version (kernels/reference.py _decode_attention) gathers every request's K and
// V blocks into padded [requests, KV heads, longest, D] tensors each step before one SDPA call:
// with 40 requests several hundred tokens deep that copy is hundreds of MB a step, more than the
// model's weights, and it was half of attention's time in a profile of the served mix. Here each
// request reads its K rows once for the scores of all its heads and its V rows once for the
// output, with no copy and no padding; requests run side by side on torch's threads.
//
// Same result as the reference: softmax(q . k * scale) over positions 0 .. seq_len - 1, query head
// h on KV head h / (H / KVH). Float32 cache only (an FP8 cache takes the reference path).
#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "torch_threads.h"
#include "vector_ops.h"

void paged_decode_attention(const at::Tensor& query,         // [T, H, D]
                            const at::Tensor& k_cache,       // [num_blocks, block_size, KVH, D]
                            const at::Tensor& v_cache,       // [num_blocks, block_size, KVH, D]
                            const at::Tensor& block_tables,  // [B, max_blocks] int32
                            const std::vector<int64_t>& requests,    // b of each one-token request
                            const std::vector<int64_t>& query_rows,  // its row in query and out
                            const std::vector<int64_t>& seq_lens,    // its cached tokens, the new one included
                            double scale, const at::Tensor& out) {   // [T, H, D], rows of these requests written
  for (const at::Tensor* t : {&query, &k_cache, &v_cache, &out}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->is_contiguous(),
                "paged_decode_attention: query, caches and out must be contiguous float32 CPU tensors");
  }
  TORCH_CHECK(scale > 0, "paged_decode_attention: scale must be positive (the row maximum is taken before scaling)");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.is_contiguous(),
              "paged_decode_attention: block_tables must be contiguous int32");
  TORCH_CHECK(requests.size() == query_rows.size() && requests.size() == seq_lens.size(),
              "paged_decode_attention: one query row and one length per request");
  const int64_t heads = query.size(1), head_dim = query.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  const int64_t group = heads / kv_heads, max_blocks = block_tables.size(1);
  const int64_t token_stride = kv_heads * head_dim;  // between consecutive positions of one block
  const float* q_data = query.data_ptr<float>();
  const float* k_data = k_cache.data_ptr<float>();
  const float* v_data = v_cache.data_ptr<float>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  float* out_data = out.data_ptr<float>();
  // Every index the loops follow is checked here, before any thread reads memory through it.
  const int64_t num_requests = block_tables.size(0), num_blocks = k_cache.size(0), rows = query.size(0);
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes() && out.sizes() == query.sizes() && heads % kv_heads == 0 &&
                  k_cache.size(3) == head_dim,
              "paged_decode_attention: query, caches and out shapes disagree");
  for (size_t r = 0; r < requests.size(); ++r) {
    TORCH_CHECK(requests[r] >= 0 && requests[r] < num_requests && query_rows[r] >= 0 && query_rows[r] < rows,
                "paged_decode_attention: request or query row out of range");
    TORCH_CHECK(seq_lens[r] >= 1 && seq_lens[r] <= max_blocks * block_size,
                "paged_decode_attention: sequence length ", seq_lens[r], " outside 1 ..", max_blocks * block_size);
    const int32_t* table = tables + requests[r] * max_blocks;
    for (int64_t i = 0; i < (seq_lens[r] + block_size - 1) / block_size; ++i)
      TORCH_CHECK(table[i] >= 0 && table[i] < num_blocks, "paged_decode_attention: block id out of range");
  }

  // One request per task: its K and V rows hold every KV head side by side, so reading them once per
  // request (not once per KV head) reads each cache line once. Requests differ in length, so the
  // threads take them one at a time from a shared counter.
  const int64_t num_requests_here = static_cast<int64_t>(requests.size());
  std::atomic<int64_t> next_request{0};
  const float score_scale = static_cast<float>(scale);
  loraloom::run_on_torch_threads(num_requests_here, [&] {
    std::vector<float> scores;  // [heads, length]
    for (int64_t r = next_request++; r < num_requests_here; r = next_request++) {
      const int64_t length = seq_lens[r];
      const int32_t* table = tables + requests[r] * max_blocks;
      const float* q = q_data + query_rows[r] * heads * head_dim;
      float* o = out_data + query_rows[r] * heads * head_dim;
      scores.resize(static_cast<size_t>(heads * length));
      auto row = [&](int64_t t) {  // offset of position t's row (every KV head) in either cache
        return (static_cast<int64_t>(table[t / block_size]) * block_size + t % block_size) * token_stride;
      };
      for (int64_t t = 0; t < length; ++t) {
        const float* k = k_data + row(t);
        for (int64_t h = 0; h < heads; ++h)
          scores[h * length + t] = loraloom::dot(q + h * head_dim, k + (h / group) * head_dim, head_dim);
      }
      std::vector<float> totals(heads);
      for (int64_t h = 0; h < heads; ++h) {
        float* s = scores.data() + h * length;
        const float peak = *std::max_element(s, s + length) * score_scale;
        float total = 0.f;
        // Vectorized exp (glibc's vector math, allowed by -fno-math-errno).
#pragma omp simd reduction(+ : total)
        for (int64_t t = 0; t < length; ++t) {
          s[t] = std::exp(s[t] * score_scale - peak);
          total += s[t];
        }
        totals[h] = total;
      }
      std::fill(o, o + heads * head_dim, 0.f);
      for (int64_t t = 0; t < length; ++t) {
        const float* v = v_data + row(t);
        for (int64_t h = 0; h < heads; ++h)
          loraloom::axpy(o + h * head_dim, v + (h / group) * head_dim, scores[h * length + t], head_dim);
      }
      for (int64_t h = 0; h < heads; ++h) {
        const float inverse = 1.f / totals[h];
        for (int64_t d = 0; d < head_dim; ++d) o[h * head_dim + d] *= inverse;
      }
    }
  });
}

// A LoRA-wrapped linear in one call, y = x @ W.T + every adapter token's LoRA, with the LoRA's
// weights streamed from memory by one thread while the others run the base matmul.
//
// Run one after the other, the base matmul and the LoRA each have every core to themselves, but they
// need different things from a core: a decode step's base matmul is bound by arithmetic (each weight
// it reads serves every row of the batch), while a decode step's LoRA reads each adapter's weights
// once for one or a few rows and is bound by memory. On a machine where one core alone draws most of
// the memory bandwidth, the second core adds little to the LoRA and sits stalled. Here one thread
// starts on the LoRA units and the others on the matmul, cut into column chunks; whoever finishes
// first takes the other kind of work, so the cores stay balanced whatever the mix of adapters.
// Measured on a 2-core EPYC, engine-direct decode steps of 8 distinct adapters, same process: the
// LoRA cost 9.1 ms a step after the chunked matmul and 5.2 ms beside it. At 32 adapters both cost
// ~17 ms: the matmul then keeps both cores busy with arithmetic, so the LoRA thread's core time (~15 ms
// a step, `perf`) comes out of the matmul's; the matmul itself is no slower beside the stream
// (BENCHMARKS.md session 12).
//
// The LoRA is summed into a zeroed buffer and added to the matmul's output at the end: each output
// element gets one base dot product and one LoRA sum, added once, as packed_add_lora adds them, so
// the result is the same bits as chunked_linear followed by packed_add_lora.
#include <ATen/ATen.h>
#include <ATen/ThreadLocalState.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "packed_lora.h"
#include "torch_threads.h"

namespace {

void check_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& out, int64_t chunk_columns) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2,
              "linear: x must be a float32 CPU matrix");
  TORCH_CHECK(weight.device().is_cpu() && weight.scalar_type() == at::kFloat && weight.dim() == 2 &&
                  weight.stride(1) == 1,
              "linear: weight must be a float32 CPU matrix with contiguous rows");
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.scalar_type() == at::kFloat && out.size(0) == x.size(0) &&
                  out.size(1) == weight.size(0) && x.size(1) == weight.size(1),
              "linear: x [T, in], weight [out, in] and a contiguous float32 out [T, out] disagree");
  TORCH_CHECK(chunk_columns > 0, "linear: chunk_columns must be positive");
}

// out = x @ weight.T in chunks of output columns, taken from a shared counter by whichever thread
// calls run(); each chunk is one single-threaded matmul.
class ColumnChunks {
 public:
  ColumnChunks(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& out, int64_t chunk_columns)
      : x_(x), weight_(weight), out_(out), chunk_columns_(chunk_columns),
        num_chunks_((weight.size(0) + chunk_columns - 1) / chunk_columns) {}

  void run() {
    const int64_t columns = weight_.size(0);
    for (int64_t c = next_++; c < num_chunks_; c = next_++) {
      const int64_t first = c * chunk_columns_, width = std::min(chunk_columns_, columns - first);
      at::Tensor part = out_.narrow(1, first, width);
      at::mm_out(part, x_, weight_.narrow(0, first, width).t());
    }
  }

 private:
  const at::Tensor &x_, &weight_, &out_;
  const int64_t chunk_columns_, num_chunks_;
  std::atomic<int64_t> next_{0};
};

// worker() on torch's threads, each with the caller's thread-local state (inference mode, dispatch
// keys), as at::parallel_for's workers get it: the workers run torch ops.
template <typename Worker>
void run_with_caller_state(const Worker& worker) {
  const at::ThreadLocalState caller_state;
  loraloom::run_on_torch_threads(at::get_num_threads(), [&] {
    const at::ThreadLocalStateGuard caller_state_here(caller_state);
    worker();
  });
}

}  // namespace

void chunked_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& out, int64_t chunk_columns) {
  check_linear(x, weight, out, chunk_columns);
  ColumnChunks matmul(x, weight, out, chunk_columns);
  run_with_caller_state([&] { matmul.run(); });
}

void linear_add_lora(const at::Tensor& x,        // [T, in] float32
                     const at::Tensor& weight,   // [out, in] float32, the base layer's W
                     const at::Tensor& out,      // [T, out] float32, written
                     int64_t chunk_columns,      // the matmul's unit of work, in output columns
                     const at::Tensor& lora_a, const std::vector<at::Tensor>& b_panels, int64_t panel_width,
                     const at::Tensor& slot_ranks, const at::Tensor& slot_types, const std::vector<int64_t>& offsets,
                     const std::vector<int64_t>& seg_starts, const std::vector<int64_t>& seg_lens,
                     const std::vector<int64_t>& seg_slots, const std::vector<int64_t>& seg_rows,
                     const at::Tensor& sorted_token_ids) {
  check_linear(x, weight, out, chunk_columns);
  const int64_t threads = at::get_num_threads();
  const at::Tensor lora_out = at::empty_like(out);
  loraloom::PackedLoRA lora(x, lora_a, b_panels, panel_width, slot_ranks, slot_types, lora_out, offsets,
                            seg_starts, seg_lens, seg_slots, seg_rows, sorted_token_ids, threads);
  ColumnChunks matmul(x, weight, out, chunk_columns);
  if (lora.num_units() == 0) {  // no segment's adapter targets this linear's modules
    run_with_caller_state([&] { matmul.run(); });
    return;
  }
  lora_out.zero_();
  const int64_t lora_thread = threads - 1;
  run_with_caller_state([&] {
    if (omp_get_thread_num() == lora_thread) {
      lora.run();
      matmul.run();
    } else {
      matmul.run();
      lora.run();
    }
  });
  out.add_(lora_out);
}

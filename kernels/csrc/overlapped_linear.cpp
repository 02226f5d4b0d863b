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
// a step, `perf`) comes out of the matmul's; the matmul itself is no slower beside the stream.
//
// The LoRA is summed into a zeroed buffer and added to the matmul's output chunk by chunk (ChunkJoin):
// each output element gets one base dot product and one LoRA sum, added once, as packed_add_lora adds
// them, so the result is the same bits as chunked_linear followed by packed_add_lora.
#include <ATen/ATen.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "packed_lora.h"
#include "panel_matmul.h"
#include "torch_threads.h"

namespace {

void check_linear(const at::Tensor& x, const at::Tensor& packed_weight, const at::Tensor& out, int64_t chunk_columns) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1,
              "linear: x must be a float32 CPU matrix with contiguous rows");
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.scalar_type() == at::kFloat && out.size(0) == x.size(0),
              "linear: out must be a contiguous float32 [T, out] with x's rows");
  const int64_t panels = (out.size(1) + loraloom::kPanelColumns - 1) / loraloom::kPanelColumns;
  TORCH_CHECK(packed_weight.device().is_cpu() && packed_weight.scalar_type() == at::kFloat &&
                  packed_weight.is_contiguous() && packed_weight.dim() == 3 && packed_weight.size(0) == panels &&
                  packed_weight.size(1) == x.size(1) && packed_weight.size(2) == loraloom::kPanelColumns,
              "linear: packed_weight must be the weight in panels, contiguous float32 [ceil(out / 32), in, 32] ",
              "(kernels/cpu_linear.py packed_weight)");
  TORCH_CHECK(chunk_columns > 0 && chunk_columns % loraloom::kPanelColumns == 0,
              "linear: chunk_columns must be a positive multiple of 32 (whole panels)");
}

// out = x @ W.T in chunks of output columns, taken from a shared counter by whichever thread calls
// run(); each chunk is one single-threaded panel_matmul (panel_matmul.h), and done(chunk) is called after it.
//
// Chunks are chunk_columns wide. Tapered, the last ones narrow down to 64 columns: a thread's share of
// what is left. The plain linear's threads start together on chunks of one width and finish together;
// beside a LoRA, one thread comes to the matmul late, at no particular point of the other's chunk, and
// waited on average half a chunk at the end of each call. Measured on a 2-core EPYC, the 120 wrapped
// linears of a batch-32 decode step of 32 adapters, same process, alternated: 61.1 -> 59.7 ms
// tapered; the plain linear tapered was no faster (49.9 -> 50.2 ms), so it keeps even chunks.
class ColumnChunks {
 public:
  ColumnChunks(const at::Tensor& x, const at::Tensor& packed_weight, const at::Tensor& out, int64_t chunk_columns,
               bool tapered)
      : x_(x), packed_weight_(packed_weight), out_(out) {
    const int64_t columns = out.size(1), threads = std::max<int64_t>(1, at::get_num_threads());
    for (int64_t first = 0; first < columns;) {
      int64_t width = chunk_columns;
      if (tapered) width = std::min(chunk_columns, std::max<int64_t>(kMinTaperedColumns, (columns - first) / threads / 64 * 64));
      starts_.push_back(first);
      first += std::min(width, columns - first);
    }
    starts_.push_back(columns);
  }

  int64_t num_chunks() const { return static_cast<int64_t>(starts_.size()) - 1; }
  int64_t first_column(int64_t chunk) const { return starts_[chunk]; }
  int64_t width(int64_t chunk) const { return starts_[chunk + 1] - starts_[chunk]; }

  template <typename Done>
  void run(const Done& done) {
    for (int64_t c = next_++; c < num_chunks(); c = next_++) {
      loraloom::panel_matmul(x_, packed_weight_, out_, first_column(c), width(c));
      done(c);
    }
  }

  void run() {
    run([](int64_t) {});
  }

 private:
  // A multiple of 64 columns keeps every chunk's columns on whole cache lines of out.
  static constexpr int64_t kMinTaperedColumns = 64;
  const at::Tensor &x_, &packed_weight_, &out_;
  std::vector<int64_t> starts_;  // each chunk's first column, then the number of columns
  std::atomic<int64_t> next_{0};
};

// Adds the LoRA's buffer into the matmul's output a column chunk at a time, inside the parallel
// region: a chunk is added once both its matmul and the whole LoRA are done, by whichever thread
// finishes the second of the two. Added after the region instead, by the calling thread alone, the
// sum kept the other threads waiting.
class ChunkJoin {
 public:
  ChunkJoin(const at::Tensor& out, const at::Tensor& lora_out, const ColumnChunks& chunks)
      : out_(out.data_ptr<float>()), lora_(lora_out.data_ptr<float>()), rows_(out.size(0)), columns_(out.size(1)),
        chunks_(chunks), waiting_(new std::atomic<int>[chunks.num_chunks()]) {
    for (int64_t c = 0; c < chunks_.num_chunks(); ++c) waiting_[c].store(2, std::memory_order_relaxed);  // matmul, LoRA
  }

  void matmul_done(int64_t chunk) { arrive(chunk); }

  // Called once, by the thread that finished the LoRA's last unit.
  void lora_done() {
    for (int64_t c = 0; c < chunks_.num_chunks(); ++c) arrive(c);
  }

 private:
  // acq_rel: the thread that arrives second sees what the first wrote (the chunk's matmul, or the LoRA).
  void arrive(int64_t chunk) {
    if (waiting_[chunk].fetch_sub(1, std::memory_order_acq_rel) == 1) add(chunk);
  }

  // out += lora_out over the chunk's columns: one add per element, as out.add_(lora_out) did.
  void add(int64_t chunk) const {
    const int64_t first = chunks_.first_column(chunk), width = chunks_.width(chunk);
    for (int64_t t = 0; t < rows_; ++t) {
      float* __restrict o = out_ + t * columns_ + first;
      const float* __restrict l = lora_ + t * columns_ + first;
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) o[j] += l[j];
    }
  }

  float* const out_;
  const float* const lora_;
  const int64_t rows_, columns_;
  const ColumnChunks& chunks_;
  const std::unique_ptr<std::atomic<int>[]> waiting_;
};

// The LoRA's buffer is zeroed inside the parallel region by the first thread to come to the LoRA, so
// the matmul starts at once; a thread that comes later waits for the zeroing to end (it has ended long
// before, unless both come at once).
class ZeroOnce {
 public:
  explicit ZeroOnce(const at::Tensor& buffer) : data_(buffer.data_ptr<float>()), count_(buffer.numel()) {}

  void ensure() {
    int expected = kUntouched;
    if (state_.compare_exchange_strong(expected, kZeroing, std::memory_order_acquire)) {
      std::memset(data_, 0, static_cast<size_t>(count_) * sizeof(float));
      state_.store(kZeroed, std::memory_order_release);
      return;
    }
    while (state_.load(std::memory_order_acquire) != kZeroed) std::this_thread::yield();
  }

 private:
  enum : int { kUntouched, kZeroing, kZeroed };
  float* const data_;
  const int64_t count_;
  std::atomic<int> state_{kUntouched};
};

}  // namespace

void chunked_linear(const at::Tensor& x, const at::Tensor& packed_weight, const at::Tensor& out, int64_t chunk_columns) {
  check_linear(x, packed_weight, out, chunk_columns);
  ColumnChunks matmul(x, packed_weight, out, chunk_columns, /*tapered=*/false);
  loraloom::run_on_torch_threads(at::get_num_threads(), [&] { matmul.run(); });
}

void linear_add_lora(const at::Tensor& x,              // [T, in] float32
                     const at::Tensor& packed_weight,  // [ceil(out / 32), in, 32] float32: the base W in panels
                     const at::Tensor& out,            // [T, out] float32, written
                     int64_t chunk_columns,            // the matmul's unit of work, in output columns
                     const at::Tensor& lora_weights, int64_t panel_width,
                     const at::Tensor& slot_ranks, const at::Tensor& slot_types, const std::vector<int64_t>& offsets,
                     const at::Tensor& segments, const at::Tensor& sorted_token_ids) {
  check_linear(x, packed_weight, out, chunk_columns);
  const int64_t threads = at::get_num_threads();
  const at::Tensor lora_out = at::empty_like(out);
  loraloom::PackedLoRA lora(x, lora_weights, panel_width, slot_ranks, slot_types, lora_out, offsets, segments,
                            sorted_token_ids, threads);
  ColumnChunks matmul(x, packed_weight, out, chunk_columns, /*tapered=*/lora.num_units() > 0);
  if (lora.num_units() == 0) {  // no segment's adapter targets this linear's modules
    loraloom::run_on_torch_threads(at::get_num_threads(), [&] { matmul.run(); });
    return;
  }
  ChunkJoin join(out, lora_out, matmul);
  ZeroOnce zero(lora_out);
  auto run_lora = [&] {
    zero.ensure();
    if (lora.run()) join.lora_done();
  };
  auto chunk_done = [&](int64_t chunk) { join.matmul_done(chunk); };
  // Any thread may end up on either kind of work, and none waits on a particular thread, so the
  // call completes whatever number of threads OpenMP gives the region.
  const int64_t lora_thread = threads - 1;
  loraloom::run_on_torch_threads(at::get_num_threads(), [&] {
    if (omp_get_thread_num() == lora_thread) {
      run_lora();
      matmul.run(chunk_done);
    } else {
      matmul.run(chunk_done);
      run_lora();
    }
  });
}

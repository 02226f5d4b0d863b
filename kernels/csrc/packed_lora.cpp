// add_lora for the CPU over a PackedStack (kernels/lora_stacks.py), in one call per wrapped linear.
//
// The plain-torch version (kernels/reference.py add_lora) is exact and simple, but on a decode
// step of many adapters it issues one shrink and up to three expand matmuls per (segment, linear):
// ~4,000 tiny ops a step at batch 32, each paying Python and dispatcher overhead that is larger
// than its arithmetic. A decode segment is a matrix-vector product, bound by reading the slot's
// weights once, so this file does every segment with plain loops the compiler vectorizes
// (-O3 -march=native, built on the machine that runs it by kernels/cpu_extension.py), a block of
// up to 8 rows at a time. A prefill segment is many blocks, which reread the slot's weights from
// cache; at LoRA's ranks that beat torch's matmul on every segment length measured (1 to 300 rows,
// 1.5-2x from 16 rows up), and a prefill's LoRA is ~2% of its base matmuls either way.
//
// The loops read each weight block front to back, one stream at a time: A row by row, B^T panel
// by panel (kernels/lora_stacks.py BPanels). Measured on a 2-core EPYC, reading two to four rows
// side by side (the earlier loops, which shared x loads that way) got a core 10-15 GB/s where one
// stream gets 22-25; a 32-adapter decode step's op went from 20 to 15 ms. A slot's B panels follow
// its A rows in one row of the stack's weights (kernels/lora_stacks.py PackedStack), so a segment
// reads one run of memory per linear, which the hardware prefetcher follows better than one run per
// part. The run is also prefetched a few KiB ahead (vector_ops.h prefetch_ahead), and a whole
// B panel is expanded four rows per pass with the rows' outputs in vector registers: on a 2-core Xeon
// that took the 32-adapter decode step's op from 23 to 20 ms and a 5-rows-per-adapter step's from 36
// to 26 ms.
//
// Same contract as the reference: rows outside every segment are never written, a slot reads
// only its own ranks in the slices it targets, and out is updated in place. x and out are float32;
// each slot's weights are float32, bfloat16 or float16 (slot_types: a slot may hold its adapter
// narrower than the stack, kernels/lora_stacks.py), widened to float32 as they are read, so every
// sum is a float32 sum over the stored weights.
#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "packed_lora.h"
#include "torch_threads.h"
#include "vector_ops.h"

namespace {

using loraloom::Slices;
using loraloom::Bf16;
using loraloom::Fp16;

// Rows of a segment computed together: each weight is read once for up to this many rows (from
// memory for the first block of a segment, from cache after), and the rows stay in L1.
constexpr int64_t kBlockRows = 8;

// kernels/lora_stacks.py PANEL_WIDTH: a slot's B^T for one slice is stored as column panels of this
// many columns, each an [r, width] row-major block, one after another (BPanels).
constexpr int64_t kPanelWidth = 64;

// kernels/lora_stacks.py WEIGHT_TYPE_CODES: the type a slot's weights are read as.
enum WeightType : int8_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

int64_t weight_type_size(int8_t type) { return type == kFloat32 ? 4 : 2; }

// Rows taken in one pass over a weight row or panel: each weight loaded serves all of them.
constexpr int64_t kRowsPerPass = 4;

// One whole panel of the expand for kRows rows: out_t[64] += coef_t[:rank] @ panel [rank, 64], the
// rows' 64 output columns each held in four vector registers while the panel streams past once.
template <int kRows, typename W>
inline void expand_whole_panel(const W* panel, int64_t rank, const float* const* coefs, float* const* outs,
                               const loraloom::Stream& stream) {
  using loraloom::Float16x;
  Float16x acc[kRows][4] = {};
  for (int64_t k = 0; k < rank; ++k) {
    const W* row = panel + k * kPanelWidth;
    loraloom::prefetch_ahead(row, kPanelWidth * sizeof(W), stream);
    const Float16x w0 = loraloom::load16(row), w1 = loraloom::load16(row + 16), w2 = loraloom::load16(row + 32),
                   w3 = loraloom::load16(row + 48);
    for (int r = 0; r < kRows; ++r) {
      const Float16x cs = Float16x{} + coefs[r][k];  // the row's coefficient in every lane
      acc[r][0] = loraloom::fma16(cs, w0, acc[r][0]);
      acc[r][1] = loraloom::fma16(cs, w1, acc[r][1]);
      acc[r][2] = loraloom::fma16(cs, w2, acc[r][2]);
      acc[r][3] = loraloom::fma16(cs, w3, acc[r][3]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int j = 0; j < 4; ++j) loraloom::store16(outs[r] + 16 * j, loraloom::load16(outs[r] + 16 * j) + acc[r][j]);
}

// The narrower last panel of a slice (width < 64), one row at a time.
template <typename W>
void expand_tail_panel(const W* panel, int64_t rank, int64_t width, const float* coef, float* out) {
  alignas(64) float acc[kPanelWidth] = {};
  for (int64_t k = 0; k < rank; ++k) {
    const float c = coef[k];
    const W* row = panel + k * width;
#pragma omp simd
    for (int64_t j = 0; j < width; ++j) acc[j] = loraloom::fma1(c, loraloom::widen1(row[j]), acc[j]);
  }
#pragma omp simd
  for (int64_t j = 0; j < width; ++j) out[j] += acc[j];
}

// One panel for every row of a block: whole panels kRowsPerPass rows per pass, the tail panel row by row.
template <typename W>
void expand_panel(const W* panel, int64_t rank, int64_t width, const float* shrunk, int64_t shrunk_stride,
                  float* const* outs, int64_t n_rows, const loraloom::Stream& stream) {
  if (width < kPanelWidth) {
    for (int64_t t = 0; t < n_rows; ++t) expand_tail_panel(panel, rank, width, shrunk + t * shrunk_stride, outs[t]);
    return;
  }
  for (int64_t t = 0; t < n_rows; t += kRowsPerPass) {
    const float* coefs[kRowsPerPass];
    const int64_t count = std::min(kRowsPerPass, n_rows - t);
    for (int64_t r = 0; r < count; ++r) coefs[r] = shrunk + (t + r) * shrunk_stride;
    loraloom::with_constant_count<kRowsPerPass>(count, [&](auto rows_now) { expand_whole_panel<decltype(rows_now)::value>(panel, rank, coefs, outs + t, stream); });
  }
}

// One block of a segment's rows: shrink every row against the slot's packed A (all targeted slices'
// rows, `total` of them, read one after another), then expand each targeted slice from its B panels,
// which follow the A rows slice after targeted slice; the slot's weights end at a_slot + used.
// W is the weights' type.
template <typename W>
void row_block(const float* x, int64_t x_stride, const int64_t* rows, int64_t n_rows, const W* a_slot,
               int64_t in_features, const int32_t* ranks, int64_t total, int64_t used, const Slices& slices,
               float* out, int64_t out_stride) {
  // One buffer per thread, kept between calls: a decode step runs ~4,000 blocks, and an allocation
  // and free each was ~0.5% of the wrapped linears' time (`perf`, batch 32).
  thread_local std::vector<float> shrunk;
  shrunk.assign(static_cast<size_t>(n_rows * total), 0.f);
  // The slot's weights are one run, read in order: its A rows, then each targeted slice's B panels.
  const size_t num_slices = slices.out_width.size();
  const loraloom::Stream stream{reinterpret_cast<const char*>(a_slot + used)};
  for (int64_t k = 0; k < total; ++k) {
    const W* a_row = a_slot + k * in_features;
    // The block's rows kRowsPerPass at a time against A's row k.
    for (int64_t t = 0; t < n_rows; t += kRowsPerPass) {
      const int64_t count = std::min(kRowsPerPass, n_rows - t);
      const float* xs[kRowsPerPass];
      float dots[kRowsPerPass];
      for (int64_t r = 0; r < count; ++r) xs[r] = x + rows[t + r] * x_stride;
      loraloom::with_constant_count<kRowsPerPass>(count, [&](auto rows_now) { loraloom::dot_rows<decltype(rows_now)::value>(a_row, xs, in_features, dots, stream); });
      for (int64_t r = 0; r < count; ++r) shrunk[(t + r) * total + k] = dots[r];
    }
  }
  float* outs[kBlockRows];
  int64_t first = 0;  // this slice's first column of shrunk
  const W* b = a_slot + total * in_features;  // this slice's B panels
  for (size_t i = 0; i < num_slices; ++i) {
    const int64_t rank = ranks[i];
    if (rank == 0) continue;  // not targeted: no panels
    const int64_t width = slices.out_width[i];
    for (int64_t start = 0; start < width; start += kPanelWidth) {
      for (int64_t t = 0; t < n_rows; ++t) outs[t] = out + rows[t] * out_stride + slices.out_offset[i] + start;
      // The panels before this one hold rank * kPanelWidth weights each.
      const W* panel = b + rank * start;
      expand_panel(panel, rank, std::min(kPanelWidth, width - start), shrunk.data() + first, total, outs, n_rows, stream);
    }
    first += rank;
    b += rank * width;
  }
}

void check_float_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, "packed_add_lora: ", name,
              " must be a float32 CPU tensor");
}

void check_weights_cpu(const at::Tensor& t) {
  const at::ScalarType type = t.scalar_type();
  TORCH_CHECK(t.device().is_cpu() && (type == at::kFloat || type == at::kBFloat16 || type == at::kHalf),
              "packed_add_lora: weights must be a float32, bfloat16 or float16 CPU tensor");
}

// f(typed pointer) with the slot's weights as their own type.
template <typename F>
void with_weight_type(int8_t type, const char* p, const F& f) {
  if (type == kFloat32) {
    f(reinterpret_cast<const float*>(p));
  } else if (type == kBFloat16) {
    f(reinterpret_cast<const Bf16*>(p));
  } else {
    f(reinterpret_cast<const Fp16*>(p));
  }
}

}  // namespace

namespace loraloom {

PackedLoRA::PackedLoRA(const at::Tensor& x, const at::Tensor& weights, int64_t panel_width,
                       const at::Tensor& slot_ranks, const at::Tensor& slot_types, const at::Tensor& out,
                       const std::vector<int64_t>& offsets, const at::Tensor& segments,
                       const at::Tensor& sorted_token_ids, int64_t threads) {
  check_float_cpu(x, "x");
  check_weights_cpu(weights);
  check_float_cpu(out, "out");
  TORCH_CHECK(x.stride(1) == 1 && out.stride(1) == 1 && weights.dim() == 2 && weights.stride(1) == 1,
              "packed_add_lora: rows must be contiguous (weights: [slots, slot elements])");
  TORCH_CHECK(slot_ranks.scalar_type() == at::kInt && slot_ranks.dim() == 2 && slot_ranks.is_contiguous(),
              "packed_add_lora: slot_ranks must be int32 [slots, slices]");
  TORCH_CHECK(offsets.size() == static_cast<size_t>(slot_ranks.size(1)) + 1,
              "packed_add_lora: one offset pair per slice (a column of slot_ranks)");
  TORCH_CHECK(panel_width == kPanelWidth, "packed_add_lora: panel_width must be ", kPanelWidth,
              " (kernels/lora_stacks.py PANEL_WIDTH)");
  in_features_ = x.size(1);
  num_slices_ = slot_ranks.size(1);
  for (int64_t i = 0; i < num_slices_; ++i) {
    TORCH_CHECK(offsets[i] >= 0 && offsets[i + 1] >= offsets[i], "packed_add_lora: offsets must be ascending from 0");
    slices_.out_width.push_back(offsets[i + 1] - offsets[i]);
    slices_.out_offset.push_back(offsets[i]);
  }
  ranks_ = slot_ranks.data_ptr<int32_t>();
  x_data_ = x.data_ptr<float>();
  x_stride_ = x.stride(0);
  out_data_ = out.data_ptr<float>();
  out_stride_ = out.stride(0);
  weight_bytes_ = static_cast<const char*>(weights.data_ptr());
  slot_bytes_ = weights.stride(0) * weights.element_size();

  // Every index the loops follow is checked here, before any thread reads memory through it.
  const int64_t num_slots = weights.size(0), rows = x.size(0);
  TORCH_CHECK(slot_ranks.size(0) == num_slots && out.size(0) == rows && offsets.back() <= out.size(1),
              "packed_add_lora: shapes of x, weights, slot_ranks and out disagree");
  TORCH_CHECK(segments.device().is_cpu() && segments.scalar_type() == at::kLong && segments.dim() == 2 &&
                  segments.size(0) == 4 && segments.is_contiguous(),
              "packed_add_lora: segments must be a contiguous int64 CPU tensor [4, segments]: each segment's start, "
              "length, slot and first row");
  const int64_t num_segments = segments.size(1);
  const int64_t* seg_starts = segments.data_ptr<int64_t>();
  const int64_t *seg_lens = seg_starts + num_segments, *seg_slots = seg_lens + num_segments,
                *seg_rows = seg_slots + num_segments;
  seg_starts_ = seg_starts;
  seg_slots_ = seg_slots;
  seg_rows_ = seg_rows;
  TORCH_CHECK(slot_types.scalar_type() == at::kChar && slot_types.is_contiguous() &&
                  slot_types.numel() == num_slots,
              "packed_add_lora: slot_types must be int8 with one entry per slot");
  types_ = slot_types.data_ptr<int8_t>();
  const int64_t row_bytes = weights.size(1) * weights.element_size();
  for (int64_t slot = 0; slot < num_slots; ++slot) {
    TORCH_CHECK(types_[slot] >= kFloat32 && types_[slot] <= kFloat16 &&
                    weight_type_size(types_[slot]) <= weights.element_size(),
                "packed_add_lora: slot type out of range or wider than the weights'");
    for (int64_t i = 0; i < num_slices_; ++i)
      TORCH_CHECK(ranks_[slot * num_slices_ + i] >= 0, "packed_add_lora: negative rank");
    // The slot's A rows and B panels, at its ranks and in its own type, must fit in its row of weights.
    TORCH_CHECK(used_weights(slot) * weight_type_size(types_[slot]) <= row_bytes,
                "packed_add_lora: slot ", slot, "'s ranks need more weights than its row of `weights` holds");
  }
  for (int64_t s = 0; s < num_segments; ++s) {
    if (seg_slots[s] < 0 || seg_lens[s] == 0) continue;
    TORCH_CHECK(seg_slots[s] < num_slots && seg_lens[s] > 0, "packed_add_lora: segment slot or length out of range");
    if (seg_rows[s] >= 0) {
      TORCH_CHECK(seg_rows[s] + seg_lens[s] <= rows, "packed_add_lora: segment rows past the batch");
    } else {
      // Only a segment whose rows are not one run reads sorted_token_ids, so they are converted at the
      // first such segment: a decode step's segments are all runs, and converting the ids on each of
      // its ~120 calls was a third of the call's planning.
      if (ids_ == nullptr) {
        token_ids_ = sorted_token_ids.to(at::kLong).contiguous();
        ids_ = token_ids_.data_ptr<int64_t>();
      }
      TORCH_CHECK(seg_starts[s] >= 0 && seg_starts[s] + seg_lens[s] <= token_ids_.numel(),
                  "packed_add_lora: segment past sorted_token_ids");
      for (int64_t t = seg_starts[s]; t < seg_starts[s] + seg_lens[s]; ++t)
        TORCH_CHECK(ids_[t] >= 0 && ids_[t] < rows, "packed_add_lora: token id past the batch");
    }
  }
  // The threads share the work as units of a segment's rows: a whole segment, or, for a segment
  // larger than one thread's share of the call (a long prefill), runs of its rows, so that every
  // thread takes part in it. A unit runs kBlockRows rows at a time on one thread: its later blocks
  // find the slot's weights in that core's cache (two threads taking turns at one segment's blocks
  // both read them from memory, and ran 30% slower).
  // A unit's work: reading the slot's weights once per block (a byte read costs about what two
  // multiply-adds do here) plus a multiply-add per weight and row.
  auto work = [&](int64_t slot, int64_t n_rows) {
    const int64_t blocks = (n_rows + kBlockRows - 1) / kBlockRows;
    return used_weights(slot) * (2 * weight_type_size(types_[slot]) * blocks + n_rows);
  };
  int64_t total_work = 0;
  for (int64_t s = 0; s < num_segments; ++s)
    if (seg_slots[s] >= 0 && seg_lens[s] > 0) total_work += work(seg_slots[s], seg_lens[s]);
  const int64_t share = std::max<int64_t>(1, total_work / std::max<int64_t>(1, threads));
  for (int64_t s = 0; s < num_segments; ++s) {
    const int64_t slot = seg_slots[s], n_rows = seg_lens[s];
    if (slot < 0 || n_rows == 0 || total_rank(slot) == 0) continue;  // rank 0: targets none of this linear's modules
    const int64_t segment_work = work(slot, n_rows);
    // Runs of about half a thread's share, in whole blocks; a segment within one share stays whole.
    const int64_t runs = segment_work <= share ? 1 : (2 * segment_work + share - 1) / share;
    const int64_t run_rows = kBlockRows * ((n_rows + runs * kBlockRows - 1) / (runs * kBlockRows));
    for (int64_t first = 0; first < n_rows; first += run_rows) {
      const int64_t count = std::min(run_rows, n_rows - first);
      units_.push_back({s, first, count, work(slot, count)});
    }
  }
  // Units differ in work (ranks 1 to 64, one to all slices, 1 to hundreds of rows), so the threads
  // take them one at a time from a shared counter rather than in fixed halves, largest first: the
  // last units taken are then small, and no thread is left alone with a big one at the end.
  std::stable_sort(units_.begin(), units_.end(), [](const Unit& a, const Unit& b) { return a.work > b.work; });
}

int64_t PackedLoRA::total_rank(int64_t slot) const {
  int64_t total = 0;
  for (int64_t i = 0; i < num_slices_; ++i) total += ranks_[slot * num_slices_ + i];
  return total;
}

int64_t PackedLoRA::used_weights(int64_t slot) const {
  int64_t used = total_rank(slot) * in_features_;
  for (int64_t i = 0; i < num_slices_; ++i) used += ranks_[slot * num_slices_ + i] * slices_.out_width[i];
  return used;
}

bool PackedLoRA::run() {
  bool finished_last = false;
  for (int64_t k = next_unit_++; k < num_units(); k = next_unit_++) {
    run_unit(k);
    // acq_rel: the thread that counts the last unit sees what every other unit wrote.
    finished_last = units_done_.fetch_add(1, std::memory_order_acq_rel) + 1 == num_units();
  }
  return finished_last;
}

void PackedLoRA::run_unit(int64_t k) const {
  int64_t rows[kBlockRows];
  const Unit& unit = units_[k];
  const int64_t s = unit.segment;
  const int64_t slot = seg_slots_[s];
  const char* slot_weights = weight_bytes_ + slot * slot_bytes_;
  const int64_t total = total_rank(slot), used = used_weights(slot);
  for (int64_t first = unit.first; first < unit.first + unit.count; first += kBlockRows) {
    const int64_t count = std::min(kBlockRows, unit.first + unit.count - first);
    for (int64_t t = 0; t < count; ++t)
      rows[t] = seg_rows_[s] >= 0 ? seg_rows_[s] + first + t : ids_[seg_starts_[s] + first + t];
    with_weight_type(types_[slot], slot_weights, [&](auto* typed_weights) {
      row_block(x_data_, x_stride_, rows, count, typed_weights, in_features_, ranks_ + slot * num_slices_,
                total, used, slices_, out_data_, out_stride_);
    });
  }
}

}  // namespace loraloom

void packed_add_lora(const at::Tensor& x,                   // [T, in]
                     const at::Tensor& weights,             // [S, slot elements]: per slot A rows, then B panels
                     int64_t panel_width,                   // kernels/lora_stacks.py PANEL_WIDTH
                     const at::Tensor& slot_ranks,          // [S, slices] int32: rank per slot and slice (0: none)
                     const at::Tensor& slot_types,          // [S] int8: each slot's WeightType, no wider than weights'
                     const at::Tensor& out,                 // [T, sum out_i], updated in place
                     const std::vector<int64_t>& offsets,   // [slices + 1] column offsets of the slices in out
                     const at::Tensor& segments,            // [4, A] int64: start, length, slot, first row
                     const at::Tensor& sorted_token_ids) {  // [>= T_lora] int32
  loraloom::PackedLoRA lora(x, weights, panel_width, slot_ranks, slot_types, out, offsets, segments, sorted_token_ids,
                            at::get_num_threads());
  loraloom::run_on_torch_threads(lora.num_units(), [&] { lora.run(); });
}

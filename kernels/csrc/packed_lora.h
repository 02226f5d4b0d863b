// One add_lora call over a PackedStack (packed_lora.cpp), checked and cut into units of work that
// threads take one at a time from a shared counter. packed_add_lora runs every unit on torch's
// threads; the overlapped linear (overlapped_linear.cpp) runs them beside the base layer's matmul.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <vector>

namespace loraloom {

// Per slice of the wrapped linear: its columns in out.
struct Slices {
  std::vector<int64_t> out_width, out_offset;
};

class PackedLoRA {
 public:
  // Checks every shape and index of the call (packed_add_lora's arguments) and plans its units for
  // `threads` threads. The tensors and vectors must outlive this object; the LoRA is added into `out`.
  PackedLoRA(const at::Tensor& x, const at::Tensor& weights, int64_t panel_width, const at::Tensor& slot_ranks,
             const at::Tensor& slot_types, const at::Tensor& out, const std::vector<int64_t>& offsets,
             const at::Tensor& segments, const at::Tensor& sorted_token_ids, int64_t threads);

  int64_t num_units() const { return static_cast<int64_t>(units_.size()); }

  // Takes units until none is left and adds their rows' LoRA into out. Any number of threads may call
  // it at once; each unit is run by exactly one of them. Returns true in the one call that finished
  // the last unit, which then sees every unit's writes to out.
  bool run();

 private:
  struct Unit {
    int64_t segment, first, count;  // rows [first, first + count) of the segment
    int64_t work;
  };
  int64_t total_rank(int64_t slot) const;
  int64_t used_weights(int64_t slot) const;  // its A rows and B panels at its ranks, in weights (not bytes)
  void run_unit(int64_t k) const;

  // The segment table's rows that the units read (kernels/metadata.py SGMVMetadata.segment_table_host).
  const int64_t *seg_starts_ = nullptr, *seg_slots_ = nullptr, *seg_rows_ = nullptr;
  Slices slices_;
  std::vector<Unit> units_;
  std::atomic<int64_t> next_unit_{0};
  std::atomic<int64_t> units_done_{0};
  at::Tensor token_ids_;  // sorted_token_ids as int64, when a segment gathers its rows through it
  const int64_t* ids_ = nullptr;
  const int32_t* ranks_ = nullptr;
  const int8_t* types_ = nullptr;
  const float* x_data_ = nullptr;
  float* out_data_ = nullptr;
  const char* weight_bytes_ = nullptr;
  int64_t x_stride_ = 0, out_stride_ = 0, slot_bytes_ = 0, in_features_ = 0, num_slices_ = 0;
};

}  // namespace loraloom

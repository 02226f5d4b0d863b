// The Python module of the compiled CPU ops (kernels/cpu_extension.py builds it): one entry per op.
#include <torch/extension.h>

#include <cstdint>
#include <vector>

void packed_add_lora(const at::Tensor& x, const at::Tensor& weights, int64_t panel_width, const at::Tensor& slot_ranks,
                     const at::Tensor& slot_types, const at::Tensor& out,
                     const std::vector<int64_t>& offsets, const at::Tensor& segments,
                     const at::Tensor& sorted_token_ids);

void chunked_linear(const at::Tensor& x, const at::Tensor& packed_weight, const at::Tensor& out, int64_t chunk_columns);

void linear_add_lora(const at::Tensor& x, const at::Tensor& packed_weight, const at::Tensor& out, int64_t chunk_columns,
                     const at::Tensor& lora_weights, int64_t panel_width,
                     const at::Tensor& slot_ranks, const at::Tensor& slot_types, const std::vector<int64_t>& offsets,
                     const at::Tensor& segments, const at::Tensor& sorted_token_ids);

void paged_decode_attention(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& block_tables, const std::vector<int64_t>& requests,
                            const std::vector<int64_t>& query_rows, const std::vector<int64_t>& seq_lens,
                            double scale, const at::Tensor& out);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("packed_add_lora", &packed_add_lora, "LoRA of every adapter segment added to out (PackedStack layout)");
  m.def("chunked_linear", &chunked_linear, "x @ W.T over W in panels, the threads sharing it as column chunks");
  m.def("linear_add_lora", &linear_add_lora,
        "x @ W.T over W in panels plus every adapter segment's LoRA, the LoRA streamed beside the base matmul");
  m.def("paged_decode_attention", &paged_decode_attention,
        "Attention of one-token requests over their paged K/V, read in place");
}

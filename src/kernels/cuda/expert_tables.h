// The device-side description of an MoE layer's routed experts (pointer tables indexed by
// expert, the routing bias), made once per layer and reused while its weights stay put.
#pragma once

#include <map>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/ops.h"

namespace deepinfer::cuda {

// An e4m3 weight with f32 scales per 128 x 128 block (DeepSeek's FP8).
bool fp8_block_scaled(const Tensor& weight);

// Whether every expert's matrices are contiguous device weights of one dtype (bf16, or FP8
// block-scaled), gate/up [inter, hidden] and down [hidden, inter], inter the same for all.
bool uniform_experts(const RoutedExperts& experts);

// add_scaled_rows' entries grouped by the row of y they add to (the experts' combine), entry
// order kept within a row (a counting sort), packed for one upload: the distinct rows, where
// each one's entries start (one more than the rows), then the entries.
struct EntriesByRow {
  std::vector<int32_t> packed;
  int64_t targets = 0;
  size_t entries_at = 0;
};
EntriesByRow group_entries_by_row(const std::vector<int32_t>& rows, const Tensor& y);

struct DeviceExperts {
  bool usable = false;  // false: the experts' dtypes or shapes need the host path
  ExpertWeights weights;
  const float* correction_bias = nullptr;  // device copy, null without a bias
  const int32_t* token_experts = nullptr;  // device copy of the hash-routing table, or null
  BackendMemory memory;
};

class ExpertTables {
 public:
  // The tables for `experts`, made with `ops` on first sight (again if the weights moved).
  const DeviceExperts& find(Ops& ops, const RoutedExperts& experts);

 private:
  struct Entry {
    std::vector<const void*> key;  // every weight's address, to notice a different model
    DeviceExperts tables;
  };
  std::map<const RoutedExperts*, Entry> entries_;
};

}  // namespace deepinfer::cuda

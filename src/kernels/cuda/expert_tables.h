// The device-side description of an MoE layer's routed experts (pointer tables indexed by
// expert, the routing bias), made once per layer and reused while its weights stay put.
#pragma once

#include <map>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/ops.h"

namespace deepinfer::cuda {

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

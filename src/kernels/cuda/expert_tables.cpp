#include "kernels/cuda/expert_tables.h"

#include "core/error.h"

namespace deepinfer::cuda {
namespace {

std::vector<const void*> addresses_of(const RoutedExperts& experts) {
  std::vector<const void*> key;
  for (const auto* kind : {&experts.gate, &experts.up, &experts.down})
    for (const Tensor* weight : *kind) key.push_back(weight->data);
  return key;
}

bool same_addresses(const std::vector<const void*>& key, const RoutedExperts& experts) {
  size_t i = 0;
  for (const auto* kind : {&experts.gate, &experts.up, &experts.down}) {
    for (const Tensor* weight : *kind)
      if (i >= key.size() || key[i++] != weight->data) return false;
  }
  return i == key.size();
}

// The limits of the device routing path on top of uniform weights.
bool device_readable(const RoutedExperts& experts) {
  const auto count = experts.gate.size();
  return uniform_experts(experts) && count <= static_cast<size_t>(kMaxRoutedExperts) &&
         experts.routing.num_experts == static_cast<int>(count) &&
         experts.routing.experts_per_token <= kMaxExpertsPerToken;
}

DeviceExperts make_tables(Ops& ops, const RoutedExperts& experts) {
  DeviceExperts tables;
  if (!device_readable(experts)) return tables;
  const size_t count = experts.gate.size();
  const bool fp8 = experts.gate[0]->dtype == DType::kF8E4M3;
  // Six arrays of pointers (weights, then FP8 scales, per kind), then the bias.
  std::vector<const void*> pointers = addresses_of(experts);
  for (const auto* kind : {&experts.gate, &experts.up, &experts.down})
    for (const Tensor* weight : *kind)
      pointers.push_back(fp8 ? weight->block_scales->data : nullptr);
  const size_t pointer_bytes = pointers.size() * sizeof(void*);
  const size_t bias_bytes = experts.correction_bias.size() * sizeof(float);
  const size_t table_bytes = experts.token_experts.size() * sizeof(int32_t);
  tables.memory = ops.allocate(pointer_bytes + bias_bytes + table_bytes);
  auto* base = static_cast<char*>(tables.memory.get());
  ops.to_backend(base, pointers.data(), pointer_bytes);
  if (bias_bytes > 0) {
    ops.to_backend(base + pointer_bytes, experts.correction_bias.data(), bias_bytes);
    tables.correction_bias = reinterpret_cast<const float*>(base + pointer_bytes);
  }
  if (table_bytes > 0) {
    char* table = base + pointer_bytes + bias_bytes;
    ops.to_backend(table, experts.token_experts.data(), table_bytes);
    tables.token_experts = reinterpret_cast<const int32_t*>(table);
  }
  ops.synchronize();  // the host vectors go away on return
  auto table = [&](size_t index) {
    return reinterpret_cast<const void* const*>(base) + index * count;
  };
  auto scales = [&](size_t index) {
    return fp8 ? reinterpret_cast<const float* const*>(table(3 + index)) : nullptr;
  };
  auto scale_cols = [&](const Tensor& weight) { return fp8 ? weight.block_scales->cols : 0; };
  const Tensor& gate = *experts.gate[0];
  const Tensor& down = *experts.down[0];
  tables.weights.gate = {table(0), scales(0), gate.dim(0), scale_cols(gate)};
  tables.weights.up = {table(1), scales(1), gate.dim(0), scale_cols(*experts.up[0])};
  tables.weights.down = {table(2), scales(2), down.dim(0), scale_cols(down)};
  tables.weights.dtype = gate.dtype;
  tables.weights.inter = gate.dim(0);
  tables.usable = true;
  return tables;
}

}  // namespace

bool fp8_block_scaled(const Tensor& weight) {
  return weight.dtype == DType::kF8E4M3 && weight.block_scales &&
         weight.block_scales->block_rows == kScaleBlockEdge &&
         weight.block_scales->block_cols == kScaleBlockEdge;
}

bool uniform_experts(const RoutedExperts& experts) {
  const auto count = experts.gate.size();
  if (count == 0 || experts.up.size() != count || experts.down.size() != count) return false;
  const Tensor& first = *experts.gate[0];
  const int64_t inter = first.dim(0), hidden = first.dim(1);
  for (size_t e = 0; e < count; ++e) {
    for (const Tensor* weight : {experts.gate[e], experts.up[e], experts.down[e]}) {
      if (weight->device != Device::kCuda || weight->dtype != first.dtype || weight->rank != 2 ||
          !weight->is_contiguous())
        return false;
      if (weight->dtype != DType::kBF16 && !fp8_block_scaled(*weight)) return false;
    }
    if (experts.gate[e]->dim(0) != inter || experts.gate[e]->dim(1) != hidden ||
        experts.up[e]->dim(0) != inter || experts.up[e]->dim(1) != hidden ||
        experts.down[e]->dim(0) != hidden || experts.down[e]->dim(1) != inter)
      return false;
  }
  return true;
}

EntriesByRow group_entries_by_row(const std::vector<int32_t>& rows, const Tensor& y) {
  const int64_t y_rows = y.numel() / y.dim(-1);
  std::vector<int32_t> count(static_cast<size_t>(y_rows), 0);
  for (int32_t row : rows) {
    DI_CHECK(row >= 0 && row < y_rows, "add_scaled_rows: row {} outside y {}", row,
             y.shape_string());
    ++count[static_cast<size_t>(row)];
  }
  EntriesByRow grouped;
  std::vector<int32_t> starts = {0}, next(static_cast<size_t>(y_rows));
  for (int32_t row = 0; row < y_rows; ++row) {
    if (count[static_cast<size_t>(row)] == 0) continue;
    grouped.packed.push_back(row);
    next[static_cast<size_t>(row)] = starts.back();
    starts.push_back(starts.back() + count[static_cast<size_t>(row)]);
  }
  grouped.targets = static_cast<int64_t>(grouped.packed.size());
  grouped.packed.insert(grouped.packed.end(), starts.begin(), starts.end());
  grouped.entries_at = grouped.packed.size();
  grouped.packed.resize(grouped.entries_at + rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto at = static_cast<size_t>(next[static_cast<size_t>(rows[i])]++);
    grouped.packed[grouped.entries_at + at] = static_cast<int32_t>(i);
  }
  return grouped;
}

const DeviceExperts& ExpertTables::find(Ops& ops, const RoutedExperts& experts) {
  // Called per MoE layer per step: the check walks the weights without allocating.
  auto found = entries_.find(&experts);
  if (found != entries_.end() && same_addresses(found->second.key, experts))
    return found->second.tables;
  Entry& entry = entries_[&experts];
  entry.key = addresses_of(experts);
  entry.tables = make_tables(ops, experts);
  return entry.tables;
}

}  // namespace deepinfer::cuda

// What every backend shares: host memory, copies and the BackendTensor helper.
#include "kernels/ops.h"

#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace deepinfer {

BackendMemory host_memory(size_t bytes) {
  auto buffer = std::make_shared<Buffer>(bytes);
  return BackendMemory(buffer, buffer->data());
}

void Ops::to_backend(void* destination, const void* source, size_t bytes) {
  if (bytes > 0) std::memcpy(destination, source, bytes);
}

void Ops::to_host(void* destination, const void* source, size_t bytes) {
  if (bytes > 0) std::memcpy(destination, source, bytes);
}

void Ops::copy_within(void* destination, const void* source, size_t bytes) {
  if (bytes > 0) std::memcpy(destination, source, bytes);
}

void Ops::norm_matmuls(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed,
                       const std::vector<MatmulJob>& jobs) {
  for (const MatmulJob& job : jobs)
    DI_CHECK(job.input == nullptr, "norm_matmuls: every product reads the normalised x");
  rmsnorm(x, norm_weight, eps, normed);
  matmuls(normed, jobs);
}

void Ops::norm_silu_gate(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed,
                         const MatmulJob& gate, const MatmulJob& up, Tensor& act) {
  norm_matmuls(x, norm_weight, eps, normed, {gate, up});
  silu_mul(*gate.out, *up.out, act);
}

void Ops::norm_qkv_rope_write(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed,
                              const std::vector<MatmulJob>& qkv, Tensor& q_heads, Tensor& k_heads,
                              const Tensor& v_heads, const float* cos, const float* sin,
                              int rotary_dim, const AttentionBatch& batch,
                              const PagedKvView& cache) {
  norm_matmuls(x, norm_weight, eps, normed, qkv);
  rope_kv_write(q_heads, k_heads, v_heads, cos, sin, rotary_dim, batch, cache);
}

void Ops::matmul_add(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& scratch,
                     Tensor& y) {
  matmul(x, weight, bias, scratch);
  add(y, scratch);
}

void Ops::rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const float* cos, const float* sin,
                        int rotary_dim, const AttentionBatch& batch, const PagedKvView& cache) {
  rope(q, cos, sin, rotary_dim, false);
  rope(k, cos, sin, rotary_dim, false);
  kv_write(k, &v, batch, cache);
}

namespace {

ExpertGroups group_by_expert(const std::vector<int32_t>& chosen, const std::vector<float>& weights,
                             size_t per_token, size_t num_experts) {
  std::vector<int64_t> next(num_experts + 1, 0);
  for (int32_t e : chosen) ++next[static_cast<size_t>(e) + 1];
  ExpertGroups groups;
  for (size_t e = 0; e < num_experts; ++e) {
    if (next[e + 1] > 0) {
      groups.experts.push_back(e);
      groups.first.push_back(next[e]);
    }
    next[e + 1] += next[e];
  }
  groups.first.push_back(next[num_experts]);
  groups.rows.resize(chosen.size());
  groups.scales.resize(chosen.size());
  for (size_t i = 0; i < chosen.size(); ++i) {
    auto pair = static_cast<size_t>(next[static_cast<size_t>(chosen[i])]++);
    groups.rows[pair] = static_cast<int32_t>(i / per_token);
    groups.scales[pair] = weights[i];
  }
  return groups;
}

}  // namespace

ExpertGroups Ops::group_routed_pairs(const Tensor& x, const Tensor& router_logits,
                                     const RoutedExperts& experts, const int32_t* token_ids) {
  const ExpertRouting& routing = experts.routing;
  const auto per_token = static_cast<size_t>(routing.experts_per_token);
  std::vector<int32_t> chosen(static_cast<size_t>(x.dim(0)) * per_token);
  std::vector<int32_t> fixed_experts;  // hash routing: each row's token's row of the table
  if (!experts.token_experts.empty()) {
    std::vector<int32_t> ids(static_cast<size_t>(x.dim(0)));
    to_host(ids.data(), token_ids, ids.size() * sizeof(int32_t));
    for (int32_t id : ids) {
      auto row = experts.token_experts.begin() + static_cast<std::ptrdiff_t>(id * per_token);
      fixed_experts.insert(fixed_experts.end(), row, row + static_cast<std::ptrdiff_t>(per_token));
    }
  }
  std::vector<float> weights(chosen.size());
  route_experts(router_logits, experts.correction_bias, routing, fixed_experts, chosen.data(),
                weights.data());
  return group_by_expert(chosen, weights, per_token, experts.gate.size());
}

void Ops::routed_experts(const Tensor& x, const Tensor& router_logits, const RoutedExperts& experts,
                         const int32_t* token_ids, Tensor& out) {
  run_expert_groups(x, experts, group_routed_pairs(x, router_logits, experts, token_ids), out);
}

void Ops::run_expert_groups(const Tensor& x, const RoutedExperts& experts,
                            const ExpertGroups& groups, Tensor& out) {
  const ExpertRouting& routing = experts.routing;
  const int64_t hidden = x.dim(1);
  const auto pairs = static_cast<int64_t>(groups.rows.size());
  if (pairs == 0) return;

  // Every pair's input row, then each expert's slice of the pairs' activations and outputs.
  BackendTensor inputs(*this, {pairs, hidden}), outputs(*this, {pairs, hidden});
  Tensor gathered = inputs.view();
  gather_rows(x, groups.rows, gathered);
  int64_t activation_floats = 0;
  bool one_width = true;
  for (size_t a = 0; a < groups.experts.size(); ++a) {
    int64_t inter = experts.gate[groups.experts[a]]->dim(0);
    one_width = one_width && inter == experts.gate[groups.experts[0]]->dim(0);
    activation_floats += (groups.first[a + 1] - groups.first[a]) * inter;
  }
  BackendTensor gates(*this, {activation_floats}), ups(*this, {activation_floats});
  std::deque<Tensor> views;  // the jobs point into it: a deque keeps elements where they are
  auto slice = [&](const BackendTensor& all, int64_t offset, int64_t rows, int64_t width) {
    return &views.emplace_back(
        Tensor::contiguous(all.data() + offset, DType::kF32, {rows, width}, device()));
  };
  std::vector<MatmulJob> up_jobs, down_jobs;
  int64_t activation_offset = 0;
  for (size_t a = 0; a < groups.experts.size(); ++a) {
    const size_t e = groups.experts[a];
    const int64_t first = groups.first[a], count = groups.first[a + 1] - first;
    const int64_t inter = experts.gate[e]->dim(0);
    Tensor* input = slice(inputs, first * hidden, count, hidden);
    Tensor* gate = slice(gates, activation_offset, count, inter);
    up_jobs.push_back({experts.gate[e], nullptr, gate, input});
    up_jobs.push_back({experts.up[e], nullptr, slice(ups, activation_offset, count, inter), input});
    down_jobs.push_back(
        {experts.down[e], nullptr, slice(outputs, first * hidden, count, hidden), gate});
    activation_offset += count * inter;
  }
  matmuls(x, up_jobs);
  // SwiGLU over every pair at once where the experts share a width (they normally do).
  auto activate = [&](Tensor& gate, const Tensor& up) {
    if (routing.swiglu_limit > 0) {
      clamped_silu_mul(gate, up, routing.swiglu_limit, gate);
    } else {
      silu_mul(gate, up, gate);
    }
  };
  if (one_width) {
    const int64_t inter = activation_floats / pairs;
    Tensor* gate = slice(gates, 0, pairs, inter);
    activate(*gate, *slice(ups, 0, pairs, inter));
  } else {
    for (size_t a = 0; a < groups.experts.size(); ++a)
      activate(*up_jobs[2 * a].out, *up_jobs[2 * a + 1].out);
  }
  matmuls(x, down_jobs);
  // Pairs are in expert order, so each row adds its experts' outputs in ascending expert order.
  add_scaled_rows(out, groups.rows, groups.scales, outputs.view());
}

size_t Ops::available_memory() const {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    size_t kib = 0;
    fields >> kib;
    return kib * 1024;
  }
  fail("/proc/meminfo has no MemAvailable line; give the KV budget in bytes instead");
}

void check_copy_shapes(const Tensor& source, const Tensor& destination) {
  bool same = source.rank == destination.rank && source.dtype == DType::kF32 &&
              destination.dtype == DType::kF32 && destination.rank <= kMaxDims;
  for (int axis = 0; same && axis < destination.rank; ++axis)
    same = source.dim(axis) == destination.dim(axis);
  DI_CHECK(same, "copy: f32 tensors of one shape needed, got {} and {}", source.shape_string(),
           destination.shape_string());
}

BackendTensor BackendTensor::zeros(Ops& ops, std::initializer_list<int64_t> shape) {
  return BackendTensor(ops, shape, true);
}

BackendTensor::BackendTensor(Ops& ops, std::initializer_list<int64_t> shape, bool zeroed) {
  view_ = Tensor::contiguous(nullptr, DType::kF32, shape, ops.device());
  size_t bytes = static_cast<size_t>(view_.numel()) * sizeof(float);
  memory_ = zeroed ? ops.allocate(bytes) : ops.allocate_scratch(bytes);
  view_.data = memory_.get();
}

const void* backend_copy(Ops& ops, const void* host, size_t bytes, BackendMemory& keep) {
  if (ops.device() == Device::kCpu) return host;
  keep = ops.allocate(bytes);
  ops.to_backend(keep.get(), host, bytes);
  return keep.get();
}

}  // namespace deepinfer

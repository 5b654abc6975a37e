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

void Ops::routed_experts(const Tensor& x, const Tensor& router_logits, const RoutedExperts& experts,
                         const int32_t* token_ids, Tensor& out) {
  const ExpertRouting& routing = experts.routing;
  const int64_t hidden = x.dim(1);
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

  // The rows (and their weights) each expert takes, in row order.
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(routing.num_experts));
  std::vector<std::vector<float>> scales(rows.size());
  for (size_t i = 0; i < chosen.size(); ++i) {
    auto e = static_cast<size_t>(chosen[i]);
    rows[e].push_back(static_cast<int32_t>(i / per_token));
    scales[e].push_back(weights[i]);
  }
  struct Active {
    size_t expert;
    BackendTensor input, gate, up, output;
  };
  std::vector<Active> active;
  for (size_t e = 0; e < rows.size(); ++e) {
    if (rows[e].empty()) continue;
    auto count = static_cast<int64_t>(rows[e].size());
    int64_t inter = experts.gate[e]->dim(0);
    active.push_back({e, BackendTensor(*this, {count, hidden}),
                      BackendTensor(*this, {count, inter}), BackendTensor(*this, {count, inter}),
                      BackendTensor(*this, {count, hidden})});
    Tensor input = active.back().input.view();
    gather_rows(x, rows[e], input);
  }
  std::deque<Tensor> views;  // the jobs point into it: a deque keeps elements where they are
  auto view_of = [&](const BackendTensor& tensor) { return &views.emplace_back(tensor.view()); };
  // Every chosen expert's gate and up products in one parallel pass, then the downs in another.
  std::vector<MatmulJob> up_jobs, down_jobs;
  for (Active& a : active) {
    up_jobs.push_back({experts.gate[a.expert], nullptr, view_of(a.gate), view_of(a.input)});
    up_jobs.push_back({experts.up[a.expert], nullptr, view_of(a.up), view_of(a.input)});
  }
  if (!up_jobs.empty()) matmuls(x, up_jobs);
  for (Active& a : active) {
    Tensor gate = a.gate.view();
    if (routing.swiglu_limit > 0) {
      clamped_silu_mul(gate, a.up.view(), routing.swiglu_limit, gate);
    } else {
      silu_mul(gate, a.up.view(), gate);
    }
    down_jobs.push_back({experts.down[a.expert], nullptr, view_of(a.output), view_of(a.gate)});
  }
  if (!down_jobs.empty()) matmuls(x, down_jobs);
  for (const Active& a : active)
    add_scaled_rows(out, rows[a.expert], scales[a.expert], a.output.view());
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

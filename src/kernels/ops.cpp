// What every backend shares: host memory, copies and the BackendTensor helper.
#include "kernels/ops.h"

#include <cstring>
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

void Ops::norm_matmuls(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed,
                       const std::vector<MatmulJob>& jobs) {
  for (const MatmulJob& job : jobs)
    DI_CHECK(job.input == nullptr, "norm_matmuls: every product reads the normalised x");
  rmsnorm(x, norm_weight, eps, normed);
  matmuls(normed, jobs);
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

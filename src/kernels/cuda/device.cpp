#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"

namespace deepinfer::cuda {
void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail("CUDA {}: {}", what, cudaGetErrorString(status));
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for the caller to see later
    return 0;
  }
  return count;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) check_cuda(cudaMalloc(&data_, bytes), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  if (offset + bytes > bytes_) fail("DeviceBuffer::upload: {} bytes past the end", bytes);
  check_cuda(cudaMemcpy(static_cast<char*>(data_) + offset, host, bytes, cudaMemcpyHostToDevice),
             "upload");
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) fail("DeviceBuffer::download: {} bytes past the end", bytes);
  check_cuda(
      cudaMemcpy(host, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost),
      "download");
}

void check_launch(const char* what) {
  check_cuda(cudaGetLastError(), what);
}

bool overlap_launches() {
  static const bool enabled = [] {
    const char* setting = std::getenv("DEEPINFER_CUDA_OVERLAP");
    return setting == nullptr || std::strcmp(setting, "0") != 0;
  }();
  return enabled;
}

void synchronize() {
  check_cuda(cudaDeviceSynchronize(), "synchronize");
}

}  // namespace deepinfer::cuda

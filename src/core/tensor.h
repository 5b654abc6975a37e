// Non-owning tensor views and an aligned owning buffer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace deepinfer {

enum class Device : uint8_t { kCpu, kCuda };

constexpr int kMaxDims = 4;

// The scales of a block-quantized weight [N, K] (DeepSeek's FP8 `weight_scale_inv`): element
// (n, k) is stored * data[(n / block_rows) * cols + k / block_cols]; data is [rows, cols].
struct BlockScales {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int block_rows = 0;
  int block_cols = 0;
};

// A view: pointer, dtype, shape and strides (in elements). It never owns memory; whoever
// made it (a mapped checkpoint, a Buffer, the KV pool) keeps the storage alive.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  int rank = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};
  // Set for block-quantized weights; owned by whoever owns the data.
  const BlockScales* block_scales = nullptr;

  // A contiguous (row-major) view.
  static Tensor contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                           Device device = Device::kCpu);

  // A view with explicit strides (in elements); the last axis is normally 1.
  static Tensor strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                        std::initializer_list<int64_t> strides, Device device = Device::kCpu);

  int64_t dim(int axis) const { return shape[static_cast<size_t>(axis < 0 ? rank + axis : axis)]; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  std::string shape_string() const;  // "[4, 64]"

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // Element offset of row `index` when every axis but the last is flattened into rows.
  int64_t row_offset(int64_t index) const;
  // Row `index` of the outermost axis, as a view of rank-1 lower.
  Tensor row(int64_t index) const;
};

// How a Buffer's storage goes back.
struct BufferFree {
  size_t mapped = 0;  // bytes of an anonymous mapping; 0: from the heap
  void operator()(void* pointer) const;
};

// Memory aligned for vector loads and huge pages, zero-initialised.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes);
  void* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  std::unique_ptr<void, BufferFree> data_;
  size_t size_ = 0;
};

// A contiguous f32 tensor that owns its storage; used for activations and test data.
class FloatTensor {
 public:
  FloatTensor() = default;
  FloatTensor(std::initializer_list<int64_t> shape);
  float* data() const { return static_cast<float*>(buffer_.data()); }
  const Tensor& view() const { return view_; }
  int64_t numel() const { return view_.numel(); }
  // A view with explicit strides (in elements); the last axis is normally 1.
  static Tensor strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                        std::initializer_list<int64_t> strides, Device device = Device::kCpu);

  int64_t dim(int axis) const { return view_.dim(axis); }

 private:
  Buffer buffer_;
  Tensor view_;
};

}  // namespace deepinfer

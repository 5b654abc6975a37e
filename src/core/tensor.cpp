#include "core/tensor.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"

namespace deepinfer {

Tensor Tensor::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                       std::initializer_list<int64_t> strides, Device device) {
  DI_CHECK(shape.size() == strides.size(), "tensor shape and strides differ in rank");
  Tensor tensor = contiguous(data, dtype, shape, device);
  int axis = 0;
  for (int64_t stride : strides) tensor.strides[static_cast<size_t>(axis++)] = stride;
  return tensor;
}

int64_t Tensor::row_offset(int64_t index) const {
  int64_t offset = 0;
  for (int axis = rank - 2; axis >= 0; --axis) {
    auto a = static_cast<size_t>(axis);
    offset += index % shape[a] * strides[a];
    index /= shape[a];
  }
  return offset;
}

Tensor Tensor::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                          Device device) {
  DI_CHECK(shape.size() <= kMaxDims, "tensor rank {} exceeds {}", shape.size(), kMaxDims);
  Tensor tensor;
  tensor.data = data;
  tensor.dtype = dtype;
  tensor.device = device;
  tensor.rank = static_cast<int>(shape.size());
  int axis = 0;
  for (int64_t extent : shape) tensor.shape[static_cast<size_t>(axis++)] = extent;
  int64_t stride = 1;
  for (int i = tensor.rank - 1; i >= 0; --i) {
    tensor.strides[static_cast<size_t>(i)] = stride;
    stride *= tensor.shape[static_cast<size_t>(i)];
  }
  return tensor;
}

int64_t Tensor::numel() const {
  int64_t count = 1;
  for (int i = 0; i < rank; ++i) count *= shape[static_cast<size_t>(i)];
  return count;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = rank - 1; i >= 0; --i) {
    if (shape[static_cast<size_t>(i)] != 1 && strides[static_cast<size_t>(i)] != expected) {
      return false;
    }
    expected *= shape[static_cast<size_t>(i)];
  }
  return true;
}

std::string Tensor::shape_string() const {
  std::string text = "[";
  for (int i = 0; i < rank; ++i) {
    if (i) text += ", ";
    text += std::to_string(shape[static_cast<size_t>(i)]);
  }
  return text + "]";
}

Tensor Tensor::row(int64_t index) const {
  Tensor view;
  view.dtype = dtype;
  view.device = device;
  view.rank = rank - 1;
  view.data =
      static_cast<char*>(data) + static_cast<size_t>(index * strides[0]) * dtype_size(dtype);
  for (int i = 1; i < rank; ++i) {
    view.shape[static_cast<size_t>(i - 1)] = shape[static_cast<size_t>(i)];
    view.strides[static_cast<size_t>(i - 1)] = strides[static_cast<size_t>(i)];
  }
  return view;
}

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kVectorAlignment = 64;

// Large buffers are anonymous mappings on huge-page boundaries: the kernel hands them out
// zeroed and backs them page by page on first touch (a KV cache of gigabytes costs nothing
// until used) and, advised, with huge pages, which keeps TLB misses out of weight streaming.
void* map_huge_aligned(size_t rounded) {
  const size_t reserved = rounded + kHugePage;
  void* mapping =
      mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(mapping);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) munmap(mapping, aligned - start);
  const size_t tail = reserved - (aligned - start) - rounded;
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + rounded), tail);
  auto* pointer = reinterpret_cast<void*>(aligned);
  madvise(pointer, rounded, MADV_HUGEPAGE);
  return pointer;
}
}  // namespace

Buffer::Buffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  if (bytes >= kHugePage) {
    const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* pointer = map_huge_aligned(rounded);
    if (pointer == nullptr) fail("out of memory allocating {} bytes", bytes);
    data_ = std::unique_ptr<void, BufferFree>(pointer, BufferFree{rounded});
    return;
  }
  const size_t rounded = (bytes + kVectorAlignment - 1) / kVectorAlignment * kVectorAlignment;
  void* pointer = std::aligned_alloc(kVectorAlignment, rounded);
  if (pointer == nullptr) fail("out of memory allocating {} bytes", bytes);
  std::memset(pointer, 0, bytes);
  data_.reset(pointer);
}

void BufferFree::operator()(void* pointer) const {
  if (mapped > 0) {
    munmap(pointer, mapped);
  } else {
    std::free(pointer);
  }
}

FloatTensor::FloatTensor(std::initializer_list<int64_t> shape) {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  buffer_ = Buffer(static_cast<size_t>(count) * sizeof(float));
  view_ = Tensor::contiguous(buffer_.data(), DType::kF32, shape);
}

}  // namespace deepinfer

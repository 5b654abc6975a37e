#include "kernels/cuda/device_tensors.h"

#include "core/error.h"

namespace deepinfer::cuda {

void require_device(const Tensor& tensor, const char* op) {
  DI_CHECK(tensor.device == Device::kCuda, "{}: a tensor {} is in host memory, not on the GPU", op,
           tensor.shape_string());
}

int64_t rows_of(const Tensor& tensor) {
  return tensor.numel() / tensor.dim(-1);
}

int64_t uniform_row_stride(const Tensor& tensor) {
  int last = tensor.rank - 1;
  if (tensor.rank < 2) return tensor.strides[0] == 1 ? tensor.shape[0] : 0;
  if (tensor.strides[static_cast<size_t>(last)] != 1) return 0;
  int64_t stride = tensor.strides[static_cast<size_t>(last - 1)];
  for (int axis = last - 2; axis >= 0; --axis) {
    auto a = static_cast<size_t>(axis);
    if (tensor.strides[a] != tensor.shape[a + 1] * tensor.strides[a + 1]) return 0;
  }
  return stride;
}

DeviceWeight device_weight(const Tensor& weight) {
  DeviceWeight w{weight.data, weight.dtype, weight.dim(-1)};
  if (weight.block_scales) {
    w.scales = weight.block_scales->data;
    w.scale_cols = weight.block_scales->cols;
    w.block_rows = weight.block_scales->block_rows;
    w.block_cols = weight.block_scales->block_cols;
  }
  return w;
}

}  // namespace deepinfer::cuda

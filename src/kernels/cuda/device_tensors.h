// How the CUDA backend reads host-side tensor descriptions of device memory: where they live,
// their rows, and a weight as the kernels take it.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/cuda/cuda_kernels.h"

namespace deepinfer::cuda {

// Fails naming `op` when `tensor` is not in device memory.
void require_device(const Tensor& tensor, const char* op);

// The rows of the last axis.
int64_t rows_of(const Tensor& tensor);

// The distance in elements between consecutive rows (last axis) when every row is contiguous
// and they are evenly spaced, as in a slice of wider rows; 0 otherwise.
int64_t uniform_row_stride(const Tensor& tensor);

// A weight as the product kernels read it, block scales included.
DeviceWeight device_weight(const Tensor& weight);

}  // namespace deepinfer::cuda

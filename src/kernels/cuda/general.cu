// Kernels for every shape and weight dtype the fast paths leave out: the f32, f16 and FP8
// prefill products of small models, MLA's per-head products, MoE row movement, gelu and the
// KV read-back. Plain f32 arithmetic; correctness first, these are not on a hot path of the
// dense bf16 models.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kv_elements.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kTile = 16;
constexpr int kThreads = 256;

__device__ float weight_at(const DeviceWeight& w, int64_t row, int64_t column) {
  const int64_t i = row * w.cols + column;
  switch (w.dtype) {
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(w.data)[i]);
    case DType::kF16:
      return __half2float(static_cast<const __half*>(w.data)[i]);
    case DType::kF8E4M3: {
      __nv_fp8_e4m3 value;
      value.__x = static_cast<const uint8_t*>(w.data)[i];
      return static_cast<float>(value) *
             w.scales[(row / w.block_rows) * w.scale_cols + column / w.block_cols];
    }
    default:
      return static_cast<const float*>(w.data)[i];
  }
}

unsigned grid_for(int64_t count) {
  return static_cast<unsigned>(std::min<int64_t>((count + kThreads - 1) / kThreads, 65535));
}

// y[t, n] = x[t, :] . W[n, :] over 16 x 16 output tiles, both operands staged in shared memory.
__global__ void matmul_tiled_kernel(const float* x, DeviceWeight w, int64_t rows, int64_t n,
                                    float* y) {
  __shared__ float xs[kTile][kTile + 1];
  __shared__ float ws[kTile][kTile + 1];
  const int64_t row = blockIdx.y * int64_t{kTile} + threadIdx.y;
  const int64_t column = blockIdx.x * int64_t{kTile} + threadIdx.x;
  const int64_t weight_row = blockIdx.x * int64_t{kTile} + threadIdx.y;
  float sum = 0.0f;
  for (int64_t k0 = 0; k0 < w.cols; k0 += kTile) {
    const int64_t k = k0 + threadIdx.x;
    xs[threadIdx.y][threadIdx.x] = (row < rows && k < w.cols) ? x[row * w.cols + k] : 0.0f;
    ws[threadIdx.y][threadIdx.x] =
        (weight_row < n && k < w.cols) ? weight_at(w, weight_row, k) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kTile; ++j) sum += xs[threadIdx.y][j] * ws[threadIdx.x][j];
    __syncthreads();
  }
  if (row < rows && column < n) y[row * n + column] = sum;
}

__global__ void add_bias_kernel(float* y, DeviceWeight bias, int64_t rows, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] += weight_at(bias, 0, i % n);
}

// One block per (token, head); threads stride over that head's outputs.
__global__ void head_matmul_kernel(const float* x, int64_t x_token_stride, int64_t x_head_stride,
                                   DeviceWeight w, HeadSlices slices, bool transposed, int heads,
                                   float* out, int64_t out_token_stride, int64_t out_head_stride) {
  const int64_t token = blockIdx.x / heads;
  const int head = static_cast<int>(blockIdx.x % heads);
  const float* in = x + token * x_token_stride + head * x_head_stride;
  float* result = out + token * out_token_stride + head * out_head_stride;
  const int64_t first = head * slices.head_stride + slices.row_begin;
  const int64_t outputs = transposed ? w.cols : slices.rows;
  const int64_t inputs = transposed ? slices.rows : w.cols;
  for (int64_t o = threadIdx.x; o < outputs; o += blockDim.x) {
    float sum = 0.0f;
    for (int64_t i = 0; i < inputs; ++i)
      sum += in[i] * (transposed ? weight_at(w, first + i, o) : weight_at(w, first + o, i));
    result[o] = sum;
  }
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int64_t width, float* out) {
  const float* source = x + int64_t{rows[blockIdx.x]} * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) out[blockIdx.x * width + i] = source[i];
}

__global__ void add_scaled_rows_kernel(float* y, ScaledRows rows, int64_t width, const float* x) {
  const int32_t begin = rows.starts[blockIdx.x], end = rows.starts[blockIdx.x + 1];
  float* target = y + int64_t{rows.targets[blockIdx.x]} * width;
  for (int64_t column = threadIdx.x; column < width; column += blockDim.x) {
    float sum = target[column];
    for (int32_t i = begin; i < end; ++i) {
      const int64_t entry = rows.entries[i];
      sum += rows.scales[entry] * x[entry * width + column];
    }
    target[column] = sum;
  }
}

__global__ void gelu_tanh_mul_kernel(const float* gate, const float* up, float* out,
                                     int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = gate[i];
    const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
    out[i] = 0.5f * g * (1.0f + tanhf(inner)) * up[i];
  }
}

template <typename T>
__global__ void kv_read_keys_kernel(PagedKvView cache, const int32_t* block_table, float* keys) {
  const int64_t token = blockIdx.x;
  const int64_t width = int64_t{cache.num_kv_heads} * cache.key_dim;
  const int64_t slot =
      int64_t{block_table[token / cache.block_size]} * cache.block_size + token % cache.block_size;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
    keys[token * width + i] = load_kv(static_cast<const T*>(cache.keys), slot * width + i);
}

// One thread per destination element; the index is split by the (right-aligned) extents.
__global__ void strided_copy_kernel(const float* source, float* destination, StridedCopy copy,
                                    int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rest = i, from = 0, to = 0;
    for (int axis = 3; axis >= 0; --axis) {
      const int64_t index = rest % copy.extent[axis];
      rest /= copy.extent[axis];
      from += index * copy.from[axis];
      to += index * copy.to[axis];
    }
    destination[to] = source[from];
  }
}

}  // namespace

void strided_copy(const float* source, float* destination, const StridedCopy& copy,
                  cudaStream_t stream) {
  int64_t count = copy.extent[0] * copy.extent[1] * copy.extent[2] * copy.extent[3];
  if (count == 0) return;
  strided_copy_kernel<<<grid_for(count), kThreads, 0, stream>>>(source, destination, copy, count);
  check_launch("strided_copy");
}

void matmul_tiled(const float* x, const DeviceWeight& weight, int64_t rows, int64_t n, float* y,
                  cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  dim3 grid(static_cast<unsigned>((n + kTile - 1) / kTile),
            static_cast<unsigned>((rows + kTile - 1) / kTile));
  matmul_tiled_kernel<<<grid, dim3(kTile, kTile), 0, stream>>>(x, weight, rows, n, y);
  check_launch("matmul_tiled");
}

void add_bias(float* y, const DeviceWeight& bias, int64_t rows, int64_t n, cudaStream_t stream) {
  add_bias_kernel<<<grid_for(rows * n), kThreads, 0, stream>>>(y, bias, rows, n);
  check_launch("add_bias");
}

void head_matmul(const float* x, int64_t x_token_stride, int64_t x_head_stride,
                 const DeviceWeight& weight, const HeadSlices& slices, bool transposed,
                 int64_t tokens, int heads, float* out, int64_t out_token_stride,
                 int64_t out_head_stride, cudaStream_t stream) {
  if (tokens == 0) return;
  head_matmul_kernel<<<static_cast<unsigned>(tokens * heads), 128, 0, stream>>>(
      x, x_token_stride, x_head_stride, weight, slices, transposed, heads, out, out_token_stride,
      out_head_stride);
  check_launch("head_matmul");
}

void gather_rows(const float* x, const int32_t* rows, int64_t count, int64_t width, float* out,
                 cudaStream_t stream) {
  if (count == 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(x, rows, width, out);
  check_launch("gather_rows");
}

void add_scaled_rows(float* y, const ScaledRows& rows, int64_t width, const float* x,
                     cudaStream_t stream) {
  if (rows.target_count == 0) return;
  add_scaled_rows_kernel<<<static_cast<unsigned>(rows.target_count), kThreads, 0, stream>>>(
      y, rows, width, x);
  check_launch("add_scaled_rows");
}

void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t count,
                   cudaStream_t stream) {
  gelu_tanh_mul_kernel<<<grid_for(count), kThreads, 0, stream>>>(gate, up, out, count);
  check_launch("gelu_tanh_mul");
}

void kv_read_keys(const PagedKvView& cache, const int32_t* block_table, int64_t count, float* keys,
                  cudaStream_t stream) {
  if (count == 0) return;
  if (cache.dtype == DType::kBF16) {
    kv_read_keys_kernel<__nv_bfloat16>
        <<<static_cast<unsigned>(count), kThreads, 0, stream>>>(cache, block_table, keys);
  } else {
    kv_read_keys_kernel<float>
        <<<static_cast<unsigned>(count), kThreads, 0, stream>>>(cache, block_table, keys);
  }
  check_launch("kv_read_keys");
}

}  // namespace deepinfer::cuda

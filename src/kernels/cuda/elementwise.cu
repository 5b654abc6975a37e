// Row-wise and elementwise kernels: one pass over memory each, f32 arithmetic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/overlap.cuh"
#include "kernels/cuda/rope_turn.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kThreads = 256;

__device__ float load_weight(const void* weight, DType dtype, int64_t i) {
  if (dtype == DType::kBF16) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(weight)[i]);
  }
  if (dtype == DType::kF16) return __half2float(static_cast<const __half*>(weight)[i]);
  return static_cast<const float*>(weight)[i];
}

constexpr int kCachedPerThread = 32;  // rows up to 8192 wide stay in registers

// One block per row: the sum of squares is reduced across the block, then every thread
// scales its columns. Rows that fit are read once, every load issued before the first use
// (a decode step's norm is a latency, not a bandwidth, problem).
__global__ void rmsnorm_kernel(const float* x, int64_t x_stride, const void* weight, DType dtype,
                               int64_t n, float eps, float* y, int64_t y_stride) {
  release_dependents();
  await_producer();
  const float* row = x + blockIdx.x * x_stride;
  float* out = y + blockIdx.x * y_stride;
  const bool cached = n <= int64_t{kCachedPerThread} * blockDim.x;
  float values[kCachedPerThread];
  float sum = 0.0f;
  if (cached) {
#pragma unroll
    for (int c = 0; c < kCachedPerThread; ++c) {
      const int64_t i = threadIdx.x + int64_t{c} * blockDim.x;
      values[c] = i < n ? row[i] : 0.0f;
    }
#pragma unroll
    for (int c = 0; c < kCachedPerThread; ++c) sum += values[c] * values[c];
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += row[i] * row[i];
  }
  __shared__ float partial[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    sum = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x == 0) partial[0] = sum;
  }
  __syncthreads();
  float scale = rsqrtf(partial[0] / static_cast<float>(n) + eps);
  if (cached) {
#pragma unroll
    for (int c = 0; c < kCachedPerThread; ++c) {
      const int64_t i = threadIdx.x + int64_t{c} * blockDim.x;
      if (i < n) out[i] = values[c] * scale * load_weight(weight, dtype, i);
    }
    return;
  }
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    out[i] = row[i] * scale * load_weight(weight, dtype, i);
}

constexpr int kWarpRowQuads = 8;  // float4s a lane keeps: rows up to 1,024 floats

// One warp per row, for narrow rows of 16-byte-aligned floats (prefill's per-head norms run
// over half a million 512-float rows, where a block-wide reduction costs more than the row's
// own memory traffic).
__global__ void rmsnorm_warp_rows_kernel(const float* x, int64_t x_stride, const void* weight,
                                         DType dtype, int64_t rows, int64_t n, float eps, float* y,
                                         int64_t y_stride) {
  release_dependents();
  await_producer();
  const int64_t r = blockIdx.x * int64_t{kThreads / 32} + threadIdx.x / 32;
  if (r >= rows) return;  // the whole warp leaves together
  const int lane = static_cast<int>(threadIdx.x % 32);
  const auto* row = reinterpret_cast<const float4*>(x + r * x_stride);
  const int64_t quads = n / 4;
  float4 values[kWarpRowQuads];
  float sum = 0.0f;
#pragma unroll
  for (int c = 0; c < kWarpRowQuads; ++c) {
    const int64_t q = lane + int64_t{c} * 32;
    values[c] = q < quads ? row[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    sum += values[c].x * values[c].x + values[c].y * values[c].y + values[c].z * values[c].z +
           values[c].w * values[c].w;
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const float scale = rsqrtf(sum / static_cast<float>(n) + eps);
  auto* out = reinterpret_cast<float4*>(y + r * y_stride);
#pragma unroll
  for (int c = 0; c < kWarpRowQuads; ++c) {
    const int64_t q = lane + int64_t{c} * 32;
    if (q >= quads) break;
    const int64_t i = 4 * q;
    out[q] = make_float4(values[c].x * scale * load_weight(weight, dtype, i),
                         values[c].y * scale * load_weight(weight, dtype, i + 1),
                         values[c].z * scale * load_weight(weight, dtype, i + 2),
                         values[c].w * scale * load_weight(weight, dtype, i + 3));
  }
}

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, int64_t count) {
  release_dependents();
  await_producer();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void clamped_silu_mul_kernel(const float* gate, const float* up, float limit, float* out,
                                        int64_t count) {
  release_dependents();
  await_producer();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    float g = fminf(gate[i], limit);
    out[i] = g / (1.0f + expf(-g)) * fminf(fmaxf(up[i], -limit), limit);
  }
}

__global__ void add_kernel(float* y, const float* x, int64_t count) {
  release_dependents();
  await_producer();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] += x[i];
}

__global__ void embedding_kernel(const void* table, DType dtype, int64_t width, const int32_t* ids,
                                 int64_t vocab, float* out) {
  const int64_t row = ids[blockIdx.x];
  const bool valid = row >= 0 && row < vocab;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
    out[blockIdx.x * width + i] = valid ? load_weight(table, dtype, row * width + i) : 0.0f;
}

// One thread per rotated pair.
__global__ void rope_kernel(float* x, RopeLayout layout, const float* cos, const float* sin,
                            int64_t tokens, int heads, int rotary_dim, bool interleaved) {
  const int half = rotary_dim / 2;
  const int64_t pairs = tokens * heads * half;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < pairs;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(p % half);
    const int64_t token_head = p / half;
    const int64_t token = token_head / heads;
    float* v = x + token * layout.token_stride + (token_head % heads) * layout.head_stride;
    const int a = interleaved ? 2 * i : i;
    const int b = interleaved ? 2 * i + 1 : i + half;
    const float c = cos[token * half + i], s = sin[token * half + i];
    const Turned turned = rope_turn(v[a], v[b], c, s);
    v[a] = turned.first;
    v[b] = turned.second;
  }
}

int grid_for(int64_t count) {
  return static_cast<int>(std::min<int64_t>((count + kThreads - 1) / kThreads, 65535));
}

}  // namespace

void rmsnorm(const float* x, int64_t x_stride, const void* weight, DType weight_dtype, int64_t rows,
             int64_t n, float eps, float* y, int64_t y_stride, cudaStream_t stream) {
  if (rows == 0) return;
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(y) % 16 == 0 && x_stride % 4 == 0 &&
                       y_stride % 4 == 0 && n % 4 == 0;
  if (aligned && n <= 4 * 32 * kWarpRowQuads) {
    const int64_t rows_per_block = kThreads / 32;
    launch_overlapped(rmsnorm_warp_rows_kernel,
                      static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block), kThreads,
                      0, stream, x, x_stride, weight, weight_dtype, rows, n, eps, y, y_stride);
    check_launch("rmsnorm");
    return;
  }
  launch_overlapped(rmsnorm_kernel, static_cast<unsigned>(rows), kThreads, 0, stream, x, x_stride,
                    weight, weight_dtype, n, eps, y, y_stride);
  check_launch("rmsnorm");
}

void silu_mul(const float* gate, const float* up, float* out, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  launch_overlapped(silu_mul_kernel, grid_for(count), kThreads, 0, stream, gate, up, out, count);
  check_launch("silu_mul");
}

void clamped_silu_mul(const float* gate, const float* up, float limit, float* out, int64_t count,
                      cudaStream_t stream) {
  if (count == 0) return;
  launch_overlapped(clamped_silu_mul_kernel, grid_for(count), kThreads, 0, stream, gate, up, limit,
                    out, count);
  check_launch("clamped_silu_mul");
}

void add(float* y, const float* x, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  launch_overlapped(add_kernel, grid_for(count), kThreads, 0, stream, y, x, count);
  check_launch("add");
}

void embedding(const void* table, DType table_dtype, int64_t width, const int32_t* ids,
               int64_t count, float* out, int64_t vocab, cudaStream_t stream) {
  if (count == 0) return;
  embedding_kernel<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(table, table_dtype, width,
                                                                          ids, vocab, out);
  check_launch("embedding");
}

void rope(float* x, RopeLayout layout, const float* cos, const float* sin, int64_t tokens,
          int heads, int rotary_dim, bool interleaved, cudaStream_t stream) {
  int64_t pairs = tokens * heads * (rotary_dim / 2);
  if (pairs == 0) return;
  rope_kernel<<<grid_for(pairs), kThreads, 0, stream>>>(x, layout, cos, sin, tokens, heads,
                                                        rotary_dim, interleaved);
  check_launch("rope");
}

}  // namespace deepinfer::cuda

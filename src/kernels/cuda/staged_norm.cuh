// RMS normalisation of x staged in a block's shared memory, for the few-rows products that
// normalise inside the launch (the register-path kernels and the row stream alike, so both
// give the same bits).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/bulk_copy.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace deepinfer::cuda {

// The threads that normalise: eight warps, threads 0-255 of the block.
constexpr int kNormWarps = 8;

// A norm weight's size: f32, or bf16 / f16.
__host__ __device__ constexpr size_t norm_element_bytes(DType dtype) {
  return dtype == DType::kF32 ? 4 : 2;
}

// The shared memory a block sets aside for the norm's weights over k (none without a norm):
// a multiple of 128 bytes, so what follows stays aligned for bulk copies.
__host__ __device__ constexpr size_t norm_weight_bytes(const FewRowsNorm& norm, int64_t k) {
  if (norm.weight == nullptr) return 0;
  return (static_cast<size_t>(k) * norm_element_bytes(norm.dtype) + 127) / 128 * 128;
}

// The norm's weights start on their way into shared memory `to` (norm_weight_bytes of it)
// before the wait for the previous kernel: they are no kernel's output, and read from memory
// after the wait they were a fifth of the fused q/k/v kernel's stalls (Nsight Compute: a
// layer's norm weights are never in L2 by the time the layer comes round again). Threads
// [0, threads) take part; where the weights are not 16-byte aligned nothing is copied and
// the normalisation reads them where they are. Returns where it reads them.
__device__ inline const void* prefetch_norm_weights(const FewRowsNorm& norm, int64_t k, void* to,
                                                    int threads) {
  const size_t bytes = static_cast<size_t>(k) * norm_element_bytes(norm.dtype);
  if (norm.weight == nullptr || reinterpret_cast<uintptr_t>(norm.weight) % 16 != 0 ||
      bytes % 16 != 0)
    return norm.weight;
  const auto* from = static_cast<const uint4*>(norm.weight);
  auto* into = static_cast<uint4*>(to);
  for (size_t i = threadIdx.x; i < bytes / 16; i += threads)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(into + i)),
                 "l"(from + i)
                 : "memory");
  asm volatile("cp.async.commit_group;" ::: "memory");
  return to;
}

// This thread's prefetch_norm_weights copies landed; a barrier after it shows them to the
// rest of the block.
__device__ __forceinline__ void await_norm_weights() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

__device__ inline float norm_scale(DType dtype, const void* weights, int64_t i) {
  if (dtype == DType::kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(weights)[i]);
  if (dtype == DType::kF16) return __half2float(static_cast<const __half*>(weights)[i]);
  return static_cast<const float*>(weights)[i];
}

// rmsnorm of the staged rows in place, with rmsnorm_kernel's arithmetic, by threads 0-255,
// the norm's weights read from `weights` (prefetch_norm_weights' answer); `sync` is a barrier
// over exactly those threads (all of the block, or a named barrier when the block has other
// warps busy elsewhere).
template <int kRows, typename Sync>
__device__ void normalise_staged(float* x, int64_t k, const FewRowsNorm& norm, const void* weights,
                                 Sync sync) {
  __shared__ float partial[kNormWarps];
  for (int r = 0; r < kRows; ++r) {
    float* row = x + r * k;
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += kNormWarps * 32) sum += row[i] * row[i];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
    sync();
    float total = 0.0f;
    for (int w = 0; w < kNormWarps; ++w) total += partial[w];
    const float scale = rsqrtf(total / static_cast<float>(k) + norm.eps);
    for (int64_t i = threadIdx.x; i < k; i += kNormWarps * 32)
      row[i] = row[i] * scale * norm_scale(norm.dtype, weights, i);
    sync();
  }
}

}  // namespace deepinfer::cuda

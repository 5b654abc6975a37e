// RMS normalisation of x staged in a block's shared memory, for the few-rows products that
// normalise inside the launch (the register-path kernels and the row stream alike, so both
// give the same bits).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"

namespace deepinfer::cuda {

// The threads that normalise: eight warps, threads 0-255 of the block.
constexpr int kNormWarps = 8;

__device__ inline float norm_scale(const FewRowsNorm& norm, int64_t i) {
  if (norm.dtype == DType::kBF16)
    return __bfloat162float(static_cast<const __nv_bfloat16*>(norm.weight)[i]);
  if (norm.dtype == DType::kF16) return __half2float(static_cast<const __half*>(norm.weight)[i]);
  return static_cast<const float*>(norm.weight)[i];
}

// rmsnorm of the staged rows in place, with rmsnorm_kernel's arithmetic, by threads 0-255;
// `sync` is a barrier over exactly those threads (all of the block, or a named barrier when
// the block has other warps busy elsewhere).
template <int kRows, typename Sync>
__device__ void normalise_staged(float* x, int64_t k, const FewRowsNorm& norm, Sync sync) {
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
      row[i] = row[i] * scale * norm_scale(norm, i);
    sync();
  }
}

}  // namespace deepinfer::cuda

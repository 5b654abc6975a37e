// Reading and writing KV cache elements of either stored type (f32 or bf16) as f32, so the
// cache kernels are written once and instantiated per type.
#pragma once

#include <cuda_bf16.h>

namespace deepinfer::cuda {

__device__ inline float load_kv(const float* base, int64_t i) {
  return base[i];
}
__device__ inline float load_kv(const __nv_bfloat16* base, int64_t i) {
  return __bfloat162float(base[i]);
}

// Four consecutive elements starting at element 4 * i4.
__device__ inline float4 load_kv4(const float* base, int64_t i4) {
  return reinterpret_cast<const float4*>(base)[i4];
}
__device__ inline float4 load_kv4(const __nv_bfloat16* base, int64_t i4) {
  const uint2 raw = reinterpret_cast<const uint2*>(base)[i4];
  const float2 low = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 high = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return make_float4(low.x, low.y, high.x, high.y);
}

__device__ inline void store_kv(float* base, int64_t i, float value) {
  base[i] = value;
}
__device__ inline void store_kv(__nv_bfloat16* base, int64_t i, float value) {
  base[i] = __float2bfloat16_rn(value);
}

}  // namespace deepinfer::cuda

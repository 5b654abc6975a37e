// How the bandwidth-bound products read a weight row: 16-byte chunks widened to floats
// in registers, with the scale of each chunk's dot product (bf16, f16: none; DeepSeek FP8:
// the 128 x 128 block's).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace deepinfer::cuda {

constexpr int kScaleBlock = 128;

__device__ inline float2 to_float2(__nv_bfloat162 pair) {
  return __bfloat1622float2(pair);
}
__device__ inline float2 to_float2(__half2 pair) {
  return __half22float2(pair);
}

// How a 16-byte chunk of a weight row becomes floats, and the scale of its dot product:
// 16-bit weights (Pair = __nv_bfloat162 or __half2), unscaled.
template <typename Pair>
struct HalfChunks {
  static constexpr int kPerChunk = 8;
  __device__ float scale(int64_t, int64_t) const { return 1.0f; }
  __device__ void widen(uint4 packed, float* w) const {
    const Pair* pairs = reinterpret_cast<const Pair*>(&packed);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 f = to_float2(pairs[j]);
      w[2 * j] = f.x;
      w[2 * j + 1] = f.y;
    }
  }
  // Elements 8 part .. 8 part + 7 of a chunk (a chunk is one part).
  __device__ void widen_part(uint4 packed, int, float (&w)[8]) const {
    widen(packed, w);
  }
};
using Bf16Chunks = HalfChunks<__nv_bfloat162>;
using F16Chunks = HalfChunks<__half2>;

// DeepSeek FP8: a chunk's 16 weights lie inside one 128 x 128 scale block.
struct Fp8Chunks {
  static constexpr int kPerChunk = 16;
  const float* scales;
  int64_t scale_cols;
  __device__ float scale(int64_t column, int64_t chunk) const {
    return scales[(column / kScaleBlock) * scale_cols + chunk * kPerChunk / kScaleBlock];
  }
  // Two weights per conversion instruction (e4m3 pairs to half2, exact), then to floats.
  __device__ void widen(uint4 packed, float* w) const {
    const auto* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&packed);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const __half2 half_pair = __nv_cvt_fp8x2_to_halfraw2(pairs[j], __NV_E4M3);
      const float2 f = __half22float2(half_pair);
      w[2 * j] = f.x;
      w[2 * j + 1] = f.y;
    }
  }
  // Elements 8 part .. 8 part + 7 of the chunk (part 0 or 1).
  __device__ void widen_part(uint4 packed, int part, float (&w)[8]) const {
    const auto* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&packed) + 4 * part;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __half22float2(__nv_cvt_fp8x2_to_halfraw2(pairs[j], __NV_E4M3));
      w[2 * j] = f.x;
      w[2 * j + 1] = f.y;
    }
  }
};

// sum over j < kPer of w[j] * x[j], four terms at a time (x 16-byte aligned): one chunk's
// dot product with one row of x, the same summation order in every product kernel.
template <int kPer>
__device__ inline float chunk_dot(const float* w, const float* x) {
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float sum = 0.0f;
#pragma unroll
  for (int q = 0; q < kPer / 4; ++q) {
    const float4 a = x4[q];
    sum += w[4 * q] * a.x + w[4 * q + 1] * a.y + w[4 * q + 2] * a.z + w[4 * q + 3] * a.w;
  }
  return sum;
}

// One 16-byte chunk of weight row `column` (chunk index `chunk`) against every row of x
// [kRows, k], added into that column's accumulators: the same arithmetic in every few-rows
// path.
template <int kRows, typename Chunks>
__device__ inline void add_chunk(const Chunks& format, uint4 packed, int64_t column, int64_t chunk,
                                 const float* x, int64_t k, float (&acc)[kRows]) {
  constexpr int kPer = Chunks::kPerChunk;
  float w[kPer];
  format.widen(packed, w);
  const float scale = format.scale(column, chunk);
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] += chunk_dot<kPer>(w, x + r * k + chunk * kPer) * scale;
}

// Each lane's partial dot products (kColumns weight rows by kRows rows of x) added across
// the warp, into every lane: one butterfly order for every few-rows path (registers and row
// stream alike), so they give the same bits.
template <int kColumns, int kRows>
__device__ inline void add_across_warp(const float (&partial)[kColumns][kRows],
                                       float (&sums)[kColumns][kRows]) {
#pragma unroll
  for (int j = 0; j < kColumns; ++j) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float sum = partial[j][r];
      for (int offset = 16; offset > 0; offset /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      sums[j][r] = sum;
    }
  }
}

}  // namespace deepinfer::cuda

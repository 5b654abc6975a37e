// Tensor-core building blocks shared by the attention kernels: mma.sync on bf16 with f32
// accumulation, ldmatrix loads of its fragments from shared memory, and bf16 packing.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

namespace deepinfer::cuda {

__device__ inline uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ inline uint4 to_bf16_chunk(const float* at) {
  const float4 low = reinterpret_cast<const float4*>(at)[0];
  const float4 high = reinterpret_cast<const float4*>(at)[1];
  __nv_bfloat162 pairs[4] = {
      __floats2bfloat162_rn(low.x, low.y), __floats2bfloat162_rn(low.z, low.w),
      __floats2bfloat162_rn(high.x, high.y), __floats2bfloat162_rn(high.z, high.w)};
  uint4 packed;
  memcpy(&packed, pairs, sizeof(packed));
  return packed;
}

// D += A B for one m16n8k16 bf16 product with f32 accumulation. Fragment layouts (PTX ISA,
// "mma.m16n8k16"): with g = lane / 4 and t = lane % 4, A holds rows g and g + 8 at columns
// 2t, 2t + 1 (and + 8); B columns g at rows 2t, 2t + 1 (and + 8); D rows g, g + 8 at columns
// 2t, 2t + 1.
__device__ inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D += A B for one m16n8k32 product of e4m3 values with f32 accumulation (sm_89 and later).
// Each 32-bit register holds four consecutive k of one row (A) or column (B): with
// g = lane / 4 and t = lane % 4, a0 is row g at k 4t..4t+3, a1 row g + 8 there, a2 and a3 the
// same rows at k 16 + 4t..; b0 column g at k 4t.., b1 at k 16 + 4t..; D as in mma_bf16. Not
// volatile, so the compiler may schedule loads across it.
__device__ inline void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four 8 x 8 bf16 matrices: lanes 8i..8i+7 give the row addresses of matrix i; lane l gets
// row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of each.
__device__ inline void load_fragments(uint32_t (&r)[4], const __nv_bfloat16* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// Four 8 x 8 bf16 matrices, transposed: lanes 8i..8i+7 give the row addresses of matrix i.
__device__ inline void load_transposed(uint32_t (&r)[4], const __nv_bfloat16* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

__device__ inline uint32_t word(const __nv_bfloat16* at) {
  return *reinterpret_cast<const uint32_t*>(at);
}

__device__ inline uint32_t pack(float low, float high) {
  __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  uint32_t bits;
  memcpy(&bits, &pair, sizeof(bits));
  return bits;
}

// Four floats as bf16 at `at` (8-byte aligned).
__device__ inline void store_bf16x4(__nv_bfloat16* at, float4 v) {
  const uint2 packed = make_uint2(pack(v.x, v.y), pack(v.z, v.w));
  *reinterpret_cast<uint2*>(at) = packed;
}

// S = Q K^T for one warp: 16 query rows from row0 against 32 keys from key0, both bf16 in
// shared memory in rows of `stride` elements, over `dim` (a multiple of 16). s[j] holds keys
// key0 + 8j .. key0 + 8j + 7 in the accumulator layout (rows g, g + 8; keys 2t, 2t + 1).
__device__ inline void warp_scores(const __nv_bfloat16* queries, const __nv_bfloat16* keys,
                                   int stride, int dim, int row0, int key0, float (&s)[4][4]) {
  const int lane = threadIdx.x % 32;
  for (int c = 0; c < dim; c += 16) {
    uint32_t a[4];
    load_fragments(a, queries + (row0 + lane % 16) * stride + c + (lane / 16) * 8);
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      // Matrices: keys +0..7 at dims c and c + 8, then keys +8..15 at both.
      uint32_t b[4];
      const int key = key0 + pair * 16 + lane % 8 + (lane / 16) * 8;
      load_fragments(b, keys + key * stride + c + ((lane / 8) % 2) * 8);
      mma_bf16(s[2 * pair], a, b[0], b[1]);
      mma_bf16(s[2 * pair + 1], a, b[2], b[3]);
    }
  }
}

}  // namespace deepinfer::cuda

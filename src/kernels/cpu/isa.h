// Per-instruction-set kernel tables for the CPU backend.
#pragma once

#include <cstdint>

namespace deepinfer::cpu {

enum class WeightType { kF32, kBF16, kF16 };

// The inner loops that differ per instruction set; everything else is shared C++.
struct IsaKernels {
  const char* name;
  // y[t * ldy + n] = sum_k x[t * ldx + k] * w[n * ldw + k] (+ bias[n]) for t < rows, n in
  // [n_begin, n_end). Reads w in its stored type.
  void (*matmul)(const float* x, int64_t ldx, const void* w, int64_t ldw, WeightType type,
                 const float* bias, int64_t rows, int64_t n_begin, int64_t n_end, int64_t depth,
                 float* y, int64_t ldy);
  float (*dot)(const float* a, const float* b, int64_t n);
  // One query head attending to cached tokens [first, last] of one KV head: scores, softmax
  // and the weighted sum of values into out[head_dim]. Tokens are found through `block_table`
  // (token t lives in block block_table[t / block_size] at offset t % block_size);
  // `token_stride` is the floats between consecutive token slots, `head_offset` this KV head's
  // offset inside a slot. `scores` needs room for last - first + 1 values.
  void (*attention_head)(const float* query, const float* keys, const float* values,
                         const int32_t* block_table, int block_size, int64_t token_stride,
                         int64_t head_offset, int head_dim, int64_t first, int64_t last,
                         float scale, float* scores, float* out);
  // Independent FMA chains for `iterations` rounds: the peak-FLOP/s probe. Returns a value
  // the caller must consume. FLOPs = iterations * fma_probe_flops_per_iteration.
  float (*fma_probe)(int64_t iterations);
  int64_t fma_probe_flops_per_iteration;
  // bf16 x bf16 -> f32 dot products (AVX512-BF16), or nullptr where the CPU lacks them. Same
  // contract as matmul with x already rounded to bf16 and bf16 weights.
  void (*matmul_bf16)(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t ldw,
                      const float* bias, int64_t rows, int64_t n_begin, int64_t n_end,
                      int64_t depth, float* y, int64_t ldy);
};

const IsaKernels& generic_kernels();
const IsaKernels* avx2_kernels();    // nullptr when not compiled in
const IsaKernels* avx512_kernels();  // nullptr when not compiled in

// The best table this CPU supports, or the one DEEPINFER_ISA names.
const IsaKernels& select_kernels();

}  // namespace deepinfer::cpu

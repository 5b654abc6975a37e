// Per-instruction-set kernel tables for the CPU backend.
#pragma once

#include <cstdint>

namespace deepinfer::cpu {

enum class WeightType { kF32, kBF16, kF16, kF8E4M3 };

// A weight matrix [rows, ld] in its stored type. FP8 weights carry one f32 scale per
// block_rows x block_cols block (DeepSeek's weight_scale_inv: value = fp8 * scale), found at
// scales[(row / block_rows) * scale_ld + col / block_cols] where `row` counts from the whole
// matrix's first row: `first_row` says which row `data` starts at, so slices keep their scales.
struct WeightMatrix {
  const void* data = nullptr;
  int64_t ld = 0;
  WeightType type = WeightType::kF32;
  const float* scales = nullptr;
  int64_t scale_ld = 0;
  int block_rows = 0;
  int block_cols = 0;
  int64_t first_row = 0;

  float scale(int64_t row, int64_t col) const {
    return scales[(first_row + row) / block_rows * scale_ld + col / block_cols];
  }
};

// The inner loops that differ per instruction set; everything else is shared C++.
struct IsaKernels {
  const char* name;
  // y[t * ldy + n] = sum_k x[t * ldx + k] * w[n, k] (+ bias[n]) for t < rows, n in
  // [n_begin, n_end). Reads w in its stored type, FP8 block by block.
  void (*matmul)(const float* x, int64_t ldx, const WeightMatrix& w, const float* bias,
                 int64_t rows, int64_t n_begin, int64_t n_end, int64_t depth, float* y,
                 int64_t ldy);
  // The other orientation: y[t * ldy + c] = sum_k x[t * ldx + k] * w[k, c] for t < rows and
  // c in [c_begin, c_end), w's rows k < depth (MLA folds kv_b_proj into queries this way).
  void (*matmul_columns)(const float* x, int64_t ldx, const WeightMatrix& w, int64_t rows,
                         int64_t c_begin, int64_t c_end, int64_t depth, float* y, int64_t ldy);
  // matmul with one summation order for every element whatever `rows` is (the
  // batch-invariant mode): a row's result does not depend on what is batched with it.
  void (*matmul_fixed_order)(const float* x, int64_t ldx, const WeightMatrix& w, const float* bias,
                             int64_t rows, int64_t n_begin, int64_t n_end, int64_t depth, float* y,
                             int64_t ldy);
  float (*dot)(const float* a, const float* b, int64_t n);
  // y[i] += a * x[i] for i < n.
  void (*axpy)(float a, const float* x, float* y, int64_t n);
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

// Portable kernels: the fallback for CPUs without AVX2, and the reference the SIMD tables are
// tested against.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/isa.h"

namespace deepinfer::cpu {
namespace {

float weight_at(const WeightMatrix& w, int64_t row, int64_t col) {
  int64_t index = row * w.ld + col;
  switch (w.type) {
    case WeightType::kF32:
      return static_cast<const float*>(w.data)[index];
    case WeightType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(w.data)[index]);
    case WeightType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(w.data)[index]);
    case WeightType::kF8E4M3:
      return f8e4m3_to_f32(static_cast<const uint8_t*>(w.data)[index]) * w.scale(row, col);
  }
  return 0.0f;
}

void generic_matmul(const float* x, int64_t ldx, const WeightMatrix& w, const float* bias,
                    int64_t rows, int64_t n_begin, int64_t n_end, int64_t depth, float* y,
                    int64_t ldy) {
  for (int64_t n = n_begin; n < n_end; ++n) {
    for (int64_t r = 0; r < rows; ++r) {
      float sum = 0.0f;
      for (int64_t k = 0; k < depth; ++k) sum += x[r * ldx + k] * weight_at(w, n, k);
      y[r * ldy + n] = sum + (bias ? bias[n] : 0.0f);
    }
  }
}

void generic_matmul_columns(const float* x, int64_t ldx, const WeightMatrix& w, int64_t rows,
                            int64_t c_begin, int64_t c_end, int64_t depth, float* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = c_begin; c < c_end; ++c) {
      float sum = 0.0f;
      for (int64_t k = 0; k < depth; ++k) sum += x[r * ldx + k] * weight_at(w, k, c);
      y[r * ldy + c] = sum;
    }
  }
}

float generic_dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void generic_axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

float generic_fma_probe(int64_t iterations) {
  float chains[4] = {1.0f, 1.1f, 1.2f, 1.3f};
  for (int64_t i = 0; i < iterations; ++i) {
    for (float& chain : chains) chain = chain * 0.9999999f + 1e-9f;
  }
  return chains[0] + chains[1] + chains[2] + chains[3];
}

}  // namespace

const IsaKernels& generic_kernels() {
  static const IsaKernels table{"generic",      generic_matmul, generic_matmul_columns,
                                generic_matmul,  // already one order for every row count
                                generic_dot,    generic_axpy,   generic_fma_probe,      8, nullptr};
  return table;
}

const IsaKernels& select_kernels() {
  static const IsaKernels& chosen = [&]() -> const IsaKernels& {
    const char* forced = std::getenv("DEEPINFER_ISA");
    bool has_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    bool has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
    if (forced != nullptr && *forced != '\0') {
      std::string_view name(forced);
      if (name == "generic") return generic_kernels();
      if (name == "avx2" && has_avx2) return *avx2_kernels();
      if (name == "avx512" && has_avx512) return *avx512_kernels();
      fail("DEEPINFER_ISA={} is not available on this CPU (try generic, avx2 or avx512)", name);
    }
    if (has_avx512) return *avx512_kernels();
    if (has_avx2) return *avx2_kernels();
    return generic_kernels();
  }();
  return chosen;
}

}  // namespace deepinfer::cpu

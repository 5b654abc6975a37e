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

float weight_at(const void* w, WeightType type, int64_t index) {
  switch (type) {
    case WeightType::kF32:
      return static_cast<const float*>(w)[index];
    case WeightType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(w)[index]);
    case WeightType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(w)[index]);
  }
  return 0.0f;
}

void generic_matmul(const float* x, int64_t ldx, const void* w, int64_t ldw, WeightType type,
                    const float* bias, int64_t rows, int64_t n_begin, int64_t n_end, int64_t depth,
                    float* y, int64_t ldy) {
  for (int64_t n = n_begin; n < n_end; ++n) {
    for (int64_t r = 0; r < rows; ++r) {
      float sum = 0.0f;
      for (int64_t k = 0; k < depth; ++k) sum += x[r * ldx + k] * weight_at(w, type, n * ldw + k);
      y[r * ldy + n] = sum + (bias ? bias[n] : 0.0f);
    }
  }
}

float generic_dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void generic_axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void generic_attention_head(const float* query, const float* keys, const float* values,
                            const int32_t* block_table, int block_size, int64_t token_stride,
                            int64_t head_offset, int head_dim, int64_t first, int64_t last,
                            float scale, float* scores, float* out) {
  auto slot = [&](const float* base, int64_t token) {
    return base +
           (int64_t{block_table[token / block_size]} * block_size + token % block_size) *
               token_stride +
           head_offset;
  };
  float max_score = -INFINITY;
  for (int64_t token = first; token <= last; ++token) {
    float score = generic_dot(query, slot(keys, token), head_dim) * scale;
    scores[token - first] = score;
    max_score = std::max(max_score, score);
  }
  float total = 0.0f;
  for (int64_t token = first; token <= last; ++token) {
    scores[token - first] = std::exp(scores[token - first] - max_score);
    total += scores[token - first];
  }
  std::fill_n(out, head_dim, 0.0f);
  for (int64_t token = first; token <= last; ++token) {
    generic_axpy(scores[token - first] / total, slot(values, token), out, head_dim);
  }
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
  static const IsaKernels table{
      "generic", generic_matmul, generic_dot, generic_attention_head, generic_fma_probe,
      8,         nullptr};
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

// AVX2 + FMA kernels. Built with AVX2 flags; only called when the CPU reports AVX2 and FMA.
#include <immintrin.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/isa.h"

namespace deepinfer::cpu {
namespace avx2 {

using Vec = __m256;
constexpr int kLanes = 8;
// 16 registers: a 2 x 4 tile leaves room for the 4 weight and 1 activation registers.
constexpr int kRowsPerTile = 2;
constexpr int kColsPerTile = 4;

inline Vec vzero() {
  return _mm256_setzero_ps();
}
inline Vec vbroadcast(float value) {
  return _mm256_set1_ps(value);
}
inline Vec load_f32(const float* p) {
  return _mm256_loadu_ps(p);
}
inline void store_f32(float* p, Vec v) {
  _mm256_storeu_ps(p, v);
}
inline Vec load_bf16(const uint16_t* p) {
  __m256i widened = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(widened, 16));
}
inline Vec load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// 8 e4m3 bytes -> f32 / 256: sign-extend to 16 bits, shift sign, exponent and mantissa into
// the f16 layout (bit 14 cleared), widen as f16.
inline Vec load_fp8(const uint8_t* p) {
  __m128i words = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  words = _mm_and_si128(_mm_slli_epi16(words, 7), _mm_set1_epi16(static_cast<short>(0xBF80)));
  return _mm256_cvtph_ps(words);
}
inline Vec vadd(Vec a, Vec b) {
  return _mm256_add_ps(a, b);
}
// 16 bf16 values as two f32 vectors: elements 0, 2, 4, ... and 1, 3, 5, ...
inline void load_bf16_pairs(const uint16_t* p, Vec& even, Vec& odd) {
  __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
  odd =
      _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
inline Vec fmadd(Vec a, Vec b, Vec c) {
  return _mm256_fmadd_ps(a, b, c);
}
inline float hsum(Vec v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

#include "kernels/cpu/simd_kernels.inc"

}  // namespace avx2

const IsaKernels* avx2_kernels() {
  static const IsaKernels table{
      "avx2",    avx2::matmul, avx2::matmul_columns, avx2::matmul_fixed_order,
      avx2::dot, avx2::axpy,   avx2::fma_probe,      avx2::kProbeFlopsPerIteration,
      nullptr};
  return &table;
}

}  // namespace deepinfer::cpu

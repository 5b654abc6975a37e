// AVX-512 kernels. Built with AVX-512 flags; only called when the CPU reports AVX-512.
// GCC 12 reports its own _mm512_undefined_* placeholders (inside reduce/convert intrinsics)
// as uninitialised; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>

#include "core/dtype.h"
#include "kernels/cpu/isa.h"

namespace deepinfer::cpu {
namespace avx512 {

using Vec = __m512;
constexpr int kLanes = 16;
// 4 x 4 tile: 16 accumulators + 4 weight + 1 activation registers of the 32.
constexpr int kRowsPerTile = 4;
constexpr int kColsPerTile = 4;
// Decode streams 8 weight rows at once to keep enough loads in flight.
constexpr bool kDecodeSequential = true;
constexpr int kDecodeCols = 8;

inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vbroadcast(float value) { return _mm512_set1_ps(value); }
inline Vec load_f32(const float* p) { return _mm512_loadu_ps(p); }
inline void store_f32(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec load_bf16(const uint16_t* p) {
  __m512i widened = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(widened, 16));
}
inline Vec load_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float hsum(Vec v) { return _mm512_reduce_add_ps(v); }

#include "kernels/cpu/simd_kernels.inc"

}  // namespace avx512

const IsaKernels* avx512_kernels() {
  static const IsaKernels table{"avx512", avx512::matmul, avx512::dot, avx512::axpy, avx512::attention_head};
  return &table;
}

}  // namespace deepinfer::cpu

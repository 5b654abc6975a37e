// AVX-512 kernels. Built with AVX-512 flags; only called when the CPU reports AVX-512.
// GCC 12 reports its own _mm512_undefined_* placeholders (inside reduce/convert intrinsics)
// as uninitialised; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/isa.h"

namespace deepinfer::cpu {
namespace avx512 {

using Vec = __m512;
constexpr int kLanes = 16;
// 4 x 4 tile: 16 accumulators + 4 weight + 1 activation registers of the 32.
constexpr int kRowsPerTile = 4;
constexpr int kColsPerTile = 4;

inline Vec vzero() {
  return _mm512_setzero_ps();
}
inline Vec vbroadcast(float value) {
  return _mm512_set1_ps(value);
}
inline Vec load_f32(const float* p) {
  return _mm512_loadu_ps(p);
}
inline void store_f32(float* p, Vec v) {
  _mm512_storeu_ps(p, v);
}
inline Vec load_bf16(const uint16_t* p) {
  __m512i widened = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(widened, 16));
}
inline Vec load_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// 16 e4m3 bytes -> f32 / 256: sign-extend to 16 bits, shift sign, exponent and mantissa into
// the f16 layout (bit 14 cleared), widen as f16.
inline Vec load_fp8(const uint8_t* p) {
  __m256i words = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  words =
      _mm256_and_si256(_mm256_slli_epi16(words, 7), _mm256_set1_epi16(static_cast<short>(0xBF80)));
  return _mm512_cvtph_ps(words);
}
inline Vec vadd(Vec a, Vec b) {
  return _mm512_add_ps(a, b);
}
// 32 bf16 values as two f32 vectors: elements 0, 2, 4, ... and 1, 3, 5, ...
inline void load_bf16_pairs(const uint16_t* p, Vec& even, Vec& odd) {
  __m512i raw = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
  odd =
      _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}
inline Vec fmadd(Vec a, Vec b, Vec c) {
  return _mm512_fmadd_ps(a, b, c);
}
inline float hsum(Vec v) {
  return _mm512_reduce_add_ps(v);
}

#include "kernels/cpu/simd_kernels.inc"

// bf16 x bf16 dot products: 32 products per instruction, twice the f32 FMA rate. A 4 x 4
// tile as in the f32 kernel; both operands are loaded as-is (no widening).
template <int ROWS, int COLS>
void bf16_tile(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t ldw, int64_t depth,
               const float* bias, float* y, int64_t ldy) {
  Vec acc[ROWS][COLS];
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) acc[r][c] = vzero();
  constexpr int kPairLanes = 32;
  int64_t k = 0;
  alignas(64) uint16_t x_tail[ROWS][kPairLanes];
  alignas(64) uint16_t w_tail[COLS][kPairLanes];
  for (; k < depth; k += kPairLanes) {
    bool tail = k + kPairLanes > depth;
    __m512bh wv[COLS];
    for (int c = 0; c < COLS; ++c) {
      const uint16_t* source = w + c * ldw + k;
      if (tail) {
        for (int i = 0; i < kPairLanes; ++i) w_tail[c][i] = k + i < depth ? source[i] : 0;
        source = w_tail[c];
      }
      wv[c] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(source));
    }
    for (int r = 0; r < ROWS; ++r) {
      const uint16_t* source = x + r * ldx + k;
      if (tail) {
        for (int i = 0; i < kPairLanes; ++i) x_tail[r][i] = k + i < depth ? source[i] : 0;
        source = x_tail[r];
      }
      __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(source));
      for (int c = 0; c < COLS; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) y[r * ldy + c] = hsum(acc[r][c]) + (bias ? bias[c] : 0.0f);
}

template <int ROWS>
void bf16_row_block(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t ldw,
                    const float* bias, int64_t n_begin, int64_t n_end, int64_t depth, float* y,
                    int64_t ldy) {
  int64_t n = n_begin;
  for (; n + kColsPerTile <= n_end; n += kColsPerTile) {
    bf16_tile<ROWS, kColsPerTile>(x, ldx, w + n * ldw, ldw, depth, bias ? bias + n : nullptr, y + n,
                                  ldy);
  }
  for (; n < n_end; ++n)
    bf16_tile<ROWS, 1>(x, ldx, w + n * ldw, ldw, depth, bias ? bias + n : nullptr, y + n, ldy);
}

void matmul_bf16(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t ldw, const float* bias,
                 int64_t rows, int64_t n_begin, int64_t n_end, int64_t depth, float* y,
                 int64_t ldy) {
  constexpr int64_t kColsPerPass = 64;
  const int64_t rows_per_block = depth >= 4096 ? 32 : 64;
  for (int64_t r0 = 0; r0 < rows; r0 += rows_per_block) {
    int64_t r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
    for (int64_t c0 = n_begin; c0 < n_end; c0 += kColsPerPass) {
      int64_t c1 = c0 + kColsPerPass < n_end ? c0 + kColsPerPass : n_end;
      int64_t r = r0;
      for (; r + kRowsPerTile <= r1; r += kRowsPerTile) {
        bf16_row_block<kRowsPerTile>(x + r * ldx, ldx, w, ldw, bias, c0, c1, depth, y + r * ldy,
                                     ldy);
      }
      for (; r < r1; ++r)
        bf16_row_block<1>(x + r * ldx, ldx, w, ldw, bias, c0, c1, depth, y + r * ldy, ldy);
    }
  }
}

}  // namespace avx512

const IsaKernels* avx512_kernels() {
  static const IsaKernels table{
      "avx512",
      avx512::matmul,
      avx512::matmul_columns,
      avx512::matmul_fixed_order,
      avx512::dot,
      avx512::axpy,
      avx512::fma_probe,
      avx512::kProbeFlopsPerIteration,
      __builtin_cpu_supports("avx512bf16") ? avx512::matmul_bf16 : nullptr};
  return &table;
}

}  // namespace deepinfer::cpu

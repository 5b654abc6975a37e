// How the fused q/k/v + rope decode product splits its columns into warp pairs, in plain
// C++ so the host tests check the mapping without a GPU. Columns are q's, then k's, then
// v's, each [heads, head_dim] flattened.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define DEEPINFER_HOST_DEVICE __host__ __device__
#else
#define DEEPINFER_HOST_DEVICE
#endif

namespace deepinfer::cuda {

struct QkvShape {
  int heads = 0, kv_heads = 0, head_dim = 0, rotary_dim = 0;

  DEEPINFER_HOST_DEVICE int64_t q_columns() const { return int64_t{heads} * head_dim; }
  DEEPINFER_HOST_DEVICE int64_t kv_columns() const { return int64_t{kv_heads} * head_dim; }
  DEEPINFER_HOST_DEVICE int64_t pairs() const { return (q_columns() + 2 * kv_columns()) / 2; }
};

// The two columns of a warp's pair, whether rope turns them, and the index into the token's
// cos/sin: in q and k each head's dims d and d + rotary_dim / 2 for d < rotary_dim / 2 (the
// pairs rope rotates), then adjacent dims past the rotary part; in v adjacent dims.
// head_dim and rotary_dim even.
struct ColumnPair {
  int64_t first = 0, second = 0;
  bool rotated = false;
  int rope_index = 0;
};

DEEPINFER_HOST_DEVICE inline ColumnPair column_pair(int64_t pair, const QkvShape& shape) {
  const int64_t q_pairs = shape.q_columns() / 2, k_pairs = shape.kv_columns() / 2;
  const int64_t pairs_per_head = shape.head_dim / 2, half = shape.rotary_dim / 2;
  if (pair >= q_pairs + k_pairs) {
    const int64_t first = shape.q_columns() + shape.kv_columns() + 2 * (pair - q_pairs - k_pairs);
    return {first, first + 1, false, 0};
  }
  const bool in_k = pair >= q_pairs;
  const int64_t local = in_k ? pair - q_pairs : pair;
  const int64_t head_start =
      (in_k ? shape.q_columns() : 0) + local / pairs_per_head * shape.head_dim;
  const int64_t i = local % pairs_per_head;
  if (i < half) return {head_start + i, head_start + i + half, true, static_cast<int>(i)};
  const int64_t first = head_start + shape.rotary_dim + 2 * (i - half);
  return {first, first + 1, false, 0};
}

}  // namespace deepinfer::cuda

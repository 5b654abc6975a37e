// The fused q/k/v + rope decode kernel's split of columns into warp pairs, checked on the
// host: every column exactly once, rope pairs (d, d + rotary_dim / 2) inside one q or k head
// with their cos/sin index, everything else adjacent and unrotated.
#include "kernels/cuda/qkv_pairs.h"

#include <gtest/gtest.h>

#include <vector>

namespace deepinfer::cuda {
namespace {

TEST(QkvPairs, EveryColumnOnceRopePairsInsideAHead) {
  for (QkvShape shape : {QkvShape{32, 8, 128, 128}, QkvShape{8, 2, 64, 32}, QkvShape{4, 4, 6, 2},
                         QkvShape{3, 1, 10, 0}}) {
    const int64_t q = shape.q_columns(), kv = shape.kv_columns(), total = q + 2 * kv;
    ASSERT_EQ(shape.pairs() * 2, total);
    std::vector<int> seen(static_cast<size_t>(total), 0);
    for (int64_t pair = 0; pair < shape.pairs(); ++pair) {
      const ColumnPair p = column_pair(pair, shape);
      ASSERT_GE(p.first, 0);
      ASSERT_LT(p.second, total);
      ++seen[static_cast<size_t>(p.first)];
      ++seen[static_cast<size_t>(p.second)];
      const bool in_v = p.first >= q + kv;
      const int64_t local = p.first < q ? p.first : (in_v ? p.first - q - kv : p.first - q);
      const int64_t dim = local % shape.head_dim;
      EXPECT_TRUE(in_v || p.first / shape.head_dim == p.second / shape.head_dim)
          << "a q or k pair inside one head";
      if (p.rotated) {
        EXPECT_FALSE(in_v);
        EXPECT_LT(dim, shape.rotary_dim / 2);
        EXPECT_EQ(p.second - p.first, shape.rotary_dim / 2);
        EXPECT_EQ(p.rope_index, dim);
      } else {
        EXPECT_EQ(p.second, p.first + 1);
        if (!in_v) {
          EXPECT_GE(dim, shape.rotary_dim);
        }
      }
    }
    for (int count : seen) EXPECT_EQ(count, 1);
  }
}

}  // namespace
}  // namespace deepinfer::cuda

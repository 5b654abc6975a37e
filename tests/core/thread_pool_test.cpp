#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace deepinfer {
namespace {

TEST(ThreadPool, EveryThreadRunsTheTask) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(3);
  for (int round = 0; round < 100; ++round) {
    pool.run([&](int thread, int count) {
      EXPECT_EQ(count, 3);
      hits[static_cast<size_t>(thread)]++;
    });
  }
  for (auto& hit : hits) EXPECT_EQ(hit.load(), 100);
}

TEST(ThreadPool, ParallelForCoversTheRangeOnceInGrainMultiples) {
  ThreadPool pool(4);
  for (int64_t count : {1, 5, 16, 17, 1000}) {
    std::vector<std::atomic<int>> covered(static_cast<size_t>(count));
    pool.parallel_for(count, 8, [&](int64_t begin, int64_t end) {
      EXPECT_EQ(begin % 8, 0);
      for (int64_t i = begin; i < end; ++i) covered[static_cast<size_t>(i)]++;
    });
    for (auto& once : covered) EXPECT_EQ(once.load(), 1);
  }
}

}  // namespace
}  // namespace deepinfer

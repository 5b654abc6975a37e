#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
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

// Two callers at once (two engines in one process) take turns: every sum is whole.
TEST(ThreadPool, CallersOnSeveralThreadsTakeTurns) {
  ThreadPool pool(4);
  std::atomic<int> wrong{0};
  auto caller = [&] {
    for (int round = 0; round < 2000; ++round) {
      std::vector<int64_t> parts(4, 0);
      pool.parallel_for(1000, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) parts[static_cast<size_t>(begin * 4 / 1000)] += i;
      });
      int64_t sum = 0;
      for (int64_t part : parts) sum += part;
      if (sum != 999 * 1000 / 2) ++wrong;
    }
  };
  std::thread first(caller), second(caller);
  first.join();
  second.join();
  EXPECT_EQ(wrong.load(), 0);
}

// A task that calls into the pool again runs that inner work on its own thread.
TEST(ThreadPool, NestedCallsRunOnTheCallingThread) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(3 * 100);
  pool.parallel_for(3, 1, [&](int64_t outer, int64_t) {
    pool.parallel_for(100, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) ++hits[static_cast<size_t>(outer * 100 + i)];
    });
  });
  for (const auto& hit : hits) EXPECT_EQ(hit.load(), 1);
}

}  // namespace
}  // namespace deepinfer

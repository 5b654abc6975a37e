// Admission and preemption policies on their own.
#include "engine/policies.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/engine.h"

namespace deepinfer {
namespace {

std::string admission_error(const GenerationRequest& request, const AdmissionLimits& limits) {
  try {
    check_admission(request, limits);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(Admission, RejectsWhatCanNeverRunWithAClearMessage) {
  AdmissionLimits limits{100, 64, 7, 4};
  GenerationRequest request;
  request.id = "x";
  request.prompt = {1, 2, 3};
  request.max_tokens = 5;
  EXPECT_EQ(admission_error(request, limits), "");
  request.max_tokens = 62;
  EXPECT_EQ(admission_error(request, limits),
            "request x: 3 prompt tokens + 62 max_tokens exceed the model's context length of 64");
  request.max_tokens = 26;
  EXPECT_EQ(admission_error(request, limits),
            "request x: 29 tokens need 8 KV blocks but the cache has 7");
  request.max_tokens = 0;
  EXPECT_EQ(admission_error(request, limits), "request x: max_tokens must be at least 1");
  request.max_tokens = 4;
  request.min_tokens = 5;
  EXPECT_NE(admission_error(request, limits).find("min_tokens"), std::string::npos);
  request.min_tokens = 0;
  request.prompt = {1, 100};
  EXPECT_EQ(admission_error(request, limits),
            "request x: token id 100 is outside the vocabulary (size 100)");
  request.prompt = {};
  EXPECT_EQ(admission_error(request, limits), "request x: the prompt is empty");
  request.prompt = {1};
  request.sampling.n = 0;
  EXPECT_EQ(admission_error(request, limits), "n must be in [1, 128], got 0");
}

TEST(Admission, SlidingGroupsCountOnlyTheirWindowAndOneChunk) {
  AdmissionLimits limits{100, 4096, 40, 4, {8, 0}, 16};
  // 100 tokens: 25 blocks in the full group; the sliding one holds at most the window (7
  // tokens before the query) plus a 16-token chunk, 6 blocks, plus one for misalignment.
  EXPECT_EQ(limits.peak_blocks(100), 25 + 7);
  EXPECT_EQ(limits.peak_blocks(8), 2 + 2);
  GenerationRequest request;
  request.id = "long";
  request.prompt = std::vector<int32_t>(100, 1);
  request.max_tokens = 32;  // 132 tokens: 33 + 7 = 40 blocks, just fits
  EXPECT_EQ(admission_error(request, limits), "");
  request.max_tokens = 33;
  EXPECT_NE(admission_error(request, limits).find("need 41 KV blocks"), std::string::npos);
}

TEST(Preemption, TheSequenceThatRunsLastGivesWay) {
  std::vector<QueueKey> running = {{0, 5}, {0, 2}, {1, 1}, {0, 9}};
  // Priority 1 runs after every priority 0 whatever its arrival.
  EXPECT_EQ(choose_preemption_victim(running, 0), 2u);
  EXPECT_EQ(choose_preemption_victim(running, 1), 2u);
  // The one needing blocks runs last itself: it waits instead of evicting others.
  EXPECT_EQ(choose_preemption_victim(running, 2), 2u);
  std::vector<QueueKey> equal = {{0, 5}, {0, 2}, {0, 9}};
  EXPECT_EQ(choose_preemption_victim(equal, 0), 2u);  // the latest arrival
  EXPECT_EQ(choose_preemption_victim(equal, 2), 2u);
}

TEST(KvBudget, BytesOrAShareOfAvailableMemory) {
  EngineConfig config;
  std::unique_ptr<Ops> ops = make_cpu_ops();
  EXPECT_EQ(kv_budget_bytes(config, *ops), size_t{1} << 30);  // the CPU's default
  config.kv_bytes = 12345;
  EXPECT_EQ(kv_budget_bytes(config, *ops), 12345u);
  config.kv_memory_fraction = 0.01;
  size_t share = kv_budget_bytes(config, *ops);
  EXPECT_GT(share, size_t{1} << 20);  // 1% of any machine that runs these tests
  config.kv_memory_fraction = 0.02;
  EXPECT_NEAR(static_cast<double>(kv_budget_bytes(config, *ops)) / static_cast<double>(share), 2.0,
              0.2);
  config.kv_memory_fraction = 1.5;
  EXPECT_THROW(kv_budget_bytes(config, *ops), Error);
}

}  // namespace
}  // namespace deepinfer

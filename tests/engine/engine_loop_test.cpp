// The library facade: requests submitted from several threads stream the same tokens the
// engine gives when driven directly; errors reach the submitter, not the engine thread.
#include "engine/engine_loop.h"

#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "core/error.h"
#include "kernels/ops.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::fixture_model;

GenerationRequest request_of(int r, int32_t vocab) {
  GenerationRequest request;
  request.id = "r" + std::to_string(r);
  for (int i = 0; i < 6 + 5 * r; ++i) request.prompt.push_back((i * 11 + r * 53 + 1) % vocab);
  request.sampling.temperature = 0.9f;
  request.sampling.seed = 100 + r;
  request.sampling.n = r % 2 + 1;
  request.max_tokens = 7;
  request.ignore_eos = true;
  return request;
}

EngineConfig loop_config(bool overlapped) {
  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 256;
  config.max_batched_tokens = 9;
  config.async_scheduling = overlapped;
  return config;
}

using Completions = std::map<std::pair<std::string, int>, std::vector<int32_t>>;

TEST(EngineLoop, StreamsAndCollectsWhatTheEngineGivesDirectly) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  int32_t vocab = model->config().vocab_size;
  Completions direct;
  {
    Engine engine(*model, loop_config(false));
    for (int r = 0; r < 6; ++r) engine.submit(request_of(r, vocab));
    for (GenerationResult& result : engine.run_to_completion())
      direct[{result.id, result.index}] = result.tokens;
  }
  for (bool overlapped : {false, true}) {
    EngineLoop loop(*model, loop_config(overlapped));
    Completions streamed, collected;
    std::mutex mutex;
    std::vector<std::thread> clients;
    for (int r = 0; r < 6; ++r) {
      clients.emplace_back([&, r] {
        auto stream = loop.submit(request_of(r, vocab));
        Completions mine;
        RequestStream::Event event;
        int ended = 0;
        while (stream->next(event)) {
          for (const TokenEvent& token : event.tokens)
            mine[{token.id, token.index}].push_back(token.token);
          ended += static_cast<int>(event.finished.size());
        }
        std::vector<GenerationResult> results = stream->collect();
        std::lock_guard lock(mutex);
        EXPECT_EQ(ended, r % 2 + 1);
        for (auto& [key, tokens] : mine) streamed[key] = tokens;
        for (GenerationResult& result : results)
          collected[{result.id, result.index}] = result.tokens;
      });
    }
    for (std::thread& client : clients) client.join();
    EXPECT_EQ(streamed, direct) << (overlapped ? "overlapped" : "plain");
    EXPECT_EQ(collected, direct);
    EXPECT_EQ(loop.stats().generated_tokens, 9 * 7);
  }
}

TEST(EngineLoop, BadRequestsFailAtSubmitAndStopEndsARequest) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  int32_t vocab = model->config().vocab_size;
  EngineLoop loop(*model, loop_config(true));
  GenerationRequest bad = request_of(0, vocab);
  bad.sampling.top_p = 2.0f;
  EXPECT_THROW(loop.submit(bad), Error);
  GenerationRequest endless = request_of(1, vocab);
  endless.sampling.n = 1;
  endless.max_tokens = 200;
  auto stream = loop.submit(endless);
  EXPECT_THROW(loop.submit(endless), Error);  // the id is in use
  RequestStream::Event event;
  ASSERT_TRUE(stream->next(event));
  loop.stop(endless.id);
  std::vector<GenerationResult> results = stream->collect();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].finish_reason, FinishReason::kStop);
  EXPECT_LT(results[0].tokens.size(), 200u);
  // The id is free again once the request ended.
  endless.max_tokens = 2;
  EXPECT_EQ(loop.submit(endless)->collect()[0].tokens.size(), 2u);
}

}  // namespace
}  // namespace deepinfer

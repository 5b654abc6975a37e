// The server with speculative decoding: completions read the same as without it, and the
// speculative counters appear in /metrics as vLLM names them.
#include <gtest/gtest.h>

#include <thread>

#include "server/server_fixture.h"
#include "support/test_support.h"

namespace deepinfer::server {
namespace {

using testing::call;
using testing::Reply;

std::string complete(const EngineConfig& engine, std::string* metrics) {
  auto ops = make_cpu_ops();
  const std::string folder = deepinfer::testing::fixture_model("demo-code-target");
  auto model = load_model(folder, LoadMode::kMmap, *ops);
  ServeOptions options;
  options.http.host = "127.0.0.1";
  options.http.port = 0;
  ApiServer server(*model, folder, engine, options);
  std::thread runner([&] { server.run(); });
  Reply reply = call(server.port(), "POST", "/v1/completions",
                     R"({"prompt": "def fibonacci(n):\n", "max_tokens": 48,
                         "temperature": 0, "ignore_eos": true})",
                     "");
  if (metrics) *metrics = call(server.port(), "GET", "/metrics", "", "").body;
  server.stop();
  runner.join();
  EXPECT_EQ(reply.status, 200) << reply.body;
  return reply.json()["choices"][0]["text"].get<std::string>();
}

TEST(ServerSpeculative, ADraftModelGivesTheSameCompletionAndCountsItsDrafts) {
  EngineConfig engine;
  engine.kv_bytes = size_t{64} << 20;
  const std::string plain = complete(engine, nullptr);
  engine.speculative.method = "draft_model";
  engine.speculative.model = deepinfer::testing::fixture_model("demo-code-draft").string();
  engine.speculative.verification = "always";
  std::string metrics;
  EXPECT_EQ(complete(engine, &metrics), plain);
  for (const char* name :
       {"vllm:spec_decode_num_drafts_total{", "vllm:spec_decode_num_draft_tokens_total{",
        "vllm:spec_decode_num_accepted_tokens_total{",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"demo-code-target\","
        "position=\"0\"}"})
    EXPECT_NE(metrics.find(name), std::string::npos) << name;
  EXPECT_EQ(metrics.find("vllm:spec_decode_num_drafts_total{model_name=\"demo-code-target\"} 0\n"),
            std::string::npos);
}

}  // namespace
}  // namespace deepinfer::server

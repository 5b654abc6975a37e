// A DeepSeek-V4 checkpoint behind the real server: chat through the DeepSeek V4 encoding
// (picked from the vocabulary), streamed and whole answers alike, tool definitions in the
// prompt, and prefix-cache hits in whole compression-window blocks.
#include <gtest/gtest.h>

#include "model/make_model.h"
#include "server/server_fixture.h"
#include "support/test_support.h"

namespace deepinfer::server {
namespace {

using testing::call;
using testing::Json;
using testing::Reply;
using testing::sse_payloads;

class DeepseekV4Server : public ::testing::Test {
 protected:
  void SetUp() override {
    MakeModelOptions o;
    o.family = "deepseek_v4";
    o.vocab_size = 129280;  // the DeepSeek vocabulary
    o.hidden_size = 64;
    o.num_layers = 3;
    o.num_heads = 4;
    o.head_dim = 32;
    o.q_lora_rank = 32;
    o.qk_rope_head_dim = 8;
    o.o_groups = 2;
    o.o_lora_rank = 16;
    o.index_heads = 2;
    o.index_head_dim = 16;
    o.index_topk = 4;
    o.num_experts = 8;
    o.experts_per_token = 2;
    o.num_shared_experts = 1;
    o.moe_intermediate_size = 32;
    o.sliding_window = 8;
    o.compress_ratios = {0, 4, 128};
    o.num_hash_layers = 1;
    make_random_model(o, dir_.path());
    deepinfer::testing::write_deepseek_v4_tokenizer(dir_.path(), false);
    ServeOptions options;
    options.served_model_name = "v4";
    server_ = std::make_unique<testing::LoopbackServer>(dir_.path().string(), options);
  }
  void TearDown() override { server_.reset(); }
  uint16_t port() const { return server_->port(); }

  deepinfer::testing::TempDir dir_;
  std::unique_ptr<testing::LoopbackServer> server_;
};

TEST_F(DeepseekV4Server, ChatStreamsToolsAndPrefixHits) {
  std::string system(1200, 'a');
  for (size_t i = 0; i < system.size(); i += 7) system[i] = ' ';
  Json body = {{"model", "v4"},
               {"messages", Json::array({{{"role", "system"}, {"content", system}},
                                         {{"role", "user"}, {"content", "What is the weather?"}}})},
               {"max_tokens", 6},
               {"temperature", 0},
               {"ignore_eos", true}};
  Reply whole = call(port(), "POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  Json answer = whole.json();
  EXPECT_EQ(answer["usage"]["completion_tokens"], 6);
  int64_t prompt_tokens = answer["usage"]["prompt_tokens"];
  EXPECT_GT(prompt_tokens, 256);
  // Again, streamed: the same tokens, and the prompt's whole 128-token blocks from the cache
  // (the blocks hold whole compression windows).
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Reply streamed = call(port(), "POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(streamed.status, 200);
  bool done = false;
  std::vector<Json> chunks = sse_payloads(streamed.body, done);
  EXPECT_TRUE(done);
  ASSERT_FALSE(chunks.empty());
  std::string text;
  for (const Json& chunk : chunks) {
    if (chunk["choices"].empty()) continue;
    const Json& delta = chunk["choices"][0]["delta"];
    if (delta.contains("content") && delta["content"].is_string())
      text += delta["content"].get<std::string>();
  }
  EXPECT_EQ(text, answer["choices"][0]["message"]["content"]);
  EXPECT_EQ(chunks.back()["usage"]["prompt_tokens_details"]["cached_tokens"],
            (prompt_tokens - 1) / 128 * 128);
  // Tool definitions go into the prompt in the V4 encoding's own section.
  body.erase("stream");
  body.erase("stream_options");
  body["tools"] = Json::array(
      {{{"type", "function"},
        {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}});
  Reply with_tools = call(port(), "POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(with_tools.status, 200) << with_tools.body;
  EXPECT_GT(with_tools.json()["usage"]["prompt_tokens"].get<int64_t>(), prompt_tokens);
}

}  // namespace
}  // namespace deepinfer::server

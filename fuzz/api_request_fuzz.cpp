// One API's request body (DEEPINFER_FUZZ_API picks which: 1 chat completions, 2 completions,
// 3 Anthropic messages, 4 Responses), parsed as the server parses it; a chat request that
// parses is then rendered as a prompt twice, through a real chat template (Qwen3's) and through
// the DeepSeek V4.1 encoding. Client errors must be 4xx ApiErrors or Errors; nothing else may
// escape.
#include <string>

#include "chat/deepseek_encoding.h"
#include "chat/model_template.h"
#include "fuzz/fuzz_support.h"
#include "protocol/anthropic.h"
#include "protocol/openai.h"
#include "protocol/responses.h"

namespace {

using namespace deepinfer;

[[maybe_unused]] void render_prompts(const chat::ChatRequest& request) {
  static const chat::ModelChatTemplate qwen_template =
      chat::ModelChatTemplate::load(DEEPINFER_FUZZ_MODEL_DIR);
  chat::RenderLimits limits;
  limits.max_steps = 500'000;
  limits.max_output_bytes = size_t{4} << 20;
  fuzz::expect_clean([&] { (void)qwen_template.render(request, limits); });
  fuzz::expect_clean([&] { (void)chat::render_deepseek_prompt({}, request); });
}

void parse_and_render(const std::string& body) {
#if DEEPINFER_FUZZ_API == 1
  render_prompts(protocol::parse_chat_completion(body).chat);
#elif DEEPINFER_FUZZ_API == 2
  (void)protocol::parse_completion(body);
#elif DEEPINFER_FUZZ_API == 3
  render_prompts(protocol::parse_messages(body).chat);
#elif DEEPINFER_FUZZ_API == 4
  render_prompts(protocol::parse_responses(body).chat);
#else
#error "DEEPINFER_FUZZ_API must be 1 to 4"
#endif
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string body(fuzz::as_text(data, size));
  fuzz::expect_clean([&] { parse_and_render(body); });
  return 0;
}

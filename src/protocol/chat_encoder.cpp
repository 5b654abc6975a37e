#include "protocol/chat_encoder.h"

#include <fmt/format.h>

#include "core/error.h"
#include "protocol/openai.h"

namespace deepinfer::protocol {
namespace {

bool ends_with_marker(std::string_view text, const std::string& marker) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  return !marker.empty() && text.size() >= marker.size() &&
         text.substr(text.size() - marker.size()) == marker;
}

using chat::DeepSeekEncoding;

// V4.1 has <｜System｜> and ｜DSML｜, V4 only ｜DSML｜; anything else uses its chat template.
std::optional<DeepSeekEncoding> detect_deepseek_encoding(const Tokenizer& tokenizer) {
  if (!tokenizer.token_to_id("｜DSML｜")) return std::nullopt;
  return tokenizer.token_to_id("<｜System｜>") ? DeepSeekEncoding::kV41 : DeepSeekEncoding::kV4;
}

}  // namespace

PromptFormat parse_prompt_format(const std::string& name) {
  if (name == "auto") return PromptFormat::kAuto;
  if (name == "template") return PromptFormat::kTemplate;
  if (name == "deepseek-v4") return PromptFormat::kDeepSeekV4;
  if (name == "deepseek-v4.1") return PromptFormat::kDeepSeekV41;
  fail("unknown prompt format '{}' (auto, template, deepseek-v4 or deepseek-v4.1)", name);
}

ChatEncoder::ChatEncoder(const std::filesystem::path& model_dir, const Tokenizer& tokenizer,
                         PromptFormat format)
    : tokenizer_(tokenizer), syntax_(detect_output_syntax(tokenizer)) {
  std::optional<DeepSeekEncoding> deepseek;
  if (format == PromptFormat::kAuto) deepseek = detect_deepseek_encoding(tokenizer);
  if (format == PromptFormat::kDeepSeekV4) deepseek = DeepSeekEncoding::kV4;
  if (format == PromptFormat::kDeepSeekV41) deepseek = DeepSeekEncoding::kV41;
  if (deepseek) {
    deepseek_ = chat::DeepSeekPromptOptions{};
    deepseek_->version = *deepseek;
    for (const char* token : {"<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"})
      if (!tokenizer.token_to_id(token))
        fail("the DeepSeek V4 prompt format needs the token {} in the vocabulary", token);
    return;
  }
  try {
    chat_template_ =
        std::make_unique<chat::ModelChatTemplate>(chat::ModelChatTemplate::load(model_dir));
  } catch (const Error&) {
    if (format == PromptFormat::kTemplate) throw;
    // Without one, chat requests answer 400 saying so; completions still work.
  }
}

chat::ForcedCallText ChatEncoder::forced_call_text() const {
  chat::ForcedCallText text;
  switch (syntax_.tools) {
    case ToolFormat::kHermesJson:
      text = {"<tool_call>\n", "{\"name\": \"", "\", \"arguments\": ", "}\n</tool_call>",
              "\n</tool_call>"};
      break;
    case ToolFormat::kDeepSeekV3:
      text = {syntax_.tool_start, "<｜tool▁call▁begin｜>function<｜tool▁sep｜>", "\n```json\n",
              "\n```<｜tool▁call▁end｜>" + syntax_.tool_end, ""};
      break;
    case ToolFormat::kDsml:
      text = chat::dsml_forced_call(deepseek_ ? deepseek_->version : DeepSeekEncoding::kV4);
      break;
    case ToolFormat::kNone:
      throw ApiError(400, "this model has no tool-call format, so tool_choice cannot force a call",
                     "tool_choice");
  }
  return text;
}

ChatPrompt ChatEncoder::encode(const chat::ChatRequest& request, size_t max_text_bytes) const {
  ChatPrompt prompt;
  if (!available()) throw ApiError(400, "this model has no chat template; use /v1/completions");
  try {
    if (deepseek_) {
      chat::SegmentedPrompt rendered = chat::render_deepseek_prompt(*deepseek_, request);
      prompt.encoded.text = std::move(rendered.text);
      prompt.encoded.client_token_text = std::move(rendered.content);
    } else {
      prompt.encoded = render_chat_prompt(*chat_template_, tokenizer_, request);
    }
  } catch (const Error& error) {
    // Well-formed, but not a conversation this model's template or encoding accepts.
    throw ApiError(422, fmt::format("the prompt could not be rendered: {}", error.what()),
                   "messages");
  }
  using Mode = chat::ToolChoice::Mode;
  bool tools_offered =
      request.tools.is_array() && !request.tools.empty() && request.tool_choice.mode != Mode::kNone;
  prompt.syntax = syntax_;
  if (!tools_offered) {
    prompt.syntax.tools = ToolFormat::kNone;
    prompt.syntax.tool_start.clear();
    prompt.syntax.tool_end.clear();
  }
  prompt.syntax.starts_in_reasoning =
      ends_with_marker(prompt.encoded.text, syntax_.reasoning_start);
  EncodedPrompt& encoded = prompt.encoded;
  if (tools_offered &&
      (request.tool_choice.mode == Mode::kRequired || request.tool_choice.mode == Mode::kNamed)) {
    // The prompt opens the call; the parser reads it as the start of the output.
    chat::ForcedCallText forced = forced_call_text();
    prompt.forced_output = forced.block;
    prompt.forced_closing = forced.after_call;
    if (request.tool_choice.mode == Mode::kNamed) {
      prompt.forced_closing = forced.after_arguments;
      const std::string& name = request.tool_choice.name;
      size_t name_at = encoded.text.size() + forced.block.size() + forced.before_name.size();
      encoded.client_token_text.emplace_back(name_at, name_at + name.size());
      prompt.forced_output += forced.before_name + name + forced.after_name;
    }
    prompt.syntax.starts_in_reasoning = false;
    encoded.text += prompt.forced_output;
  }
  if (max_text_bytes > 0 && encoded.text.size() > max_text_bytes) {
    throw ApiError(400,
                   fmt::format("the rendered prompt is {} bytes, more than the model's context "
                               "can hold (at most {} bytes)",
                               encoded.text.size(), max_text_bytes),
                   "messages");
  }
  encoded.ids = tokenizer_.encode_with_plain_ranges(encoded.text, encoded.client_token_text);
  return prompt;
}

}  // namespace deepinfer::protocol

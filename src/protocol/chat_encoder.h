// How a chat request becomes the model's prompt and how its output is read back: the model's
// chat template, or (DeepSeek V4/V4.1, which ship none) the DeepSeek encoding; plus the
// reasoning and tool-call tags of the vocabulary, and the opening of a tool call the prompt
// writes itself when tool_choice demands one.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "chat/deepseek_encoding.h"
#include "chat/model_template.h"
#include "protocol/output_parser.h"
#include "protocol/prompt.h"

namespace deepinfer::protocol {

// "auto" picks a DeepSeek encoding from the vocabulary (see detect_deepseek_encoding) and
// the chat template otherwise; "template", "deepseek-v4" and "deepseek-v4.1" force one.
enum class PromptFormat { kAuto, kTemplate, kDeepSeekV4, kDeepSeekV41 };
PromptFormat parse_prompt_format(const std::string& name);  // Error on an unknown name

struct ChatPrompt {
  EncodedPrompt encoded;
  // The tags this completion's output is parsed with (no tool format when the request offers
  // no tools); starts_in_reasoning when the prompt opened the reasoning. With tool_choice
  // required or named the prompt ends by opening the call: `forced_output` is that text, to
  // be read by the output parser before what the model writes, and `forced_closing` the text
  // that closes the call after the JSON the engine holds to the tool's schema.
  OutputSyntax syntax;
  std::string forced_output, forced_closing;
};

class ChatEncoder {
 public:
  ChatEncoder(const std::filesystem::path& model_dir, const Tokenizer& tokenizer,
              PromptFormat format);
  // False when the model has neither a template nor a DeepSeek encoding.
  bool available() const { return chat_template_ || deepseek_; }
  // ApiError 422 when the template or encoding rejects the conversation, 400 when the model
  // has no way to render chats, the request cannot be forced into a tool call, or the
  // rendered prompt is longer than `max_text_bytes` (checked before tokenizing; 0: no limit).
  ChatPrompt encode(const chat::ChatRequest& request, size_t max_text_bytes = 0) const;
  const OutputSyntax& output_syntax() const { return syntax_; }

 private:
  chat::ForcedCallText forced_call_text() const;

  const Tokenizer& tokenizer_;
  std::unique_ptr<chat::ModelChatTemplate> chat_template_;
  std::optional<chat::DeepSeekPromptOptions> deepseek_;
  OutputSyntax syntax_;
};

}  // namespace deepinfer::protocol

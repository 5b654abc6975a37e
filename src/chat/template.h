// Chat templates: the Jinja subset that real Hugging Face chat templates use, rendered the way
// transformers renders them (trim_blocks and lstrip_blocks on, tojson as json.dumps with
// ensure_ascii=False), with bounded evaluation so no template or message can hang or
// exhaust the process.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace deepinfer::chat {

struct RenderLimits {
  int64_t max_steps = 5'000'000;  // expression evaluations and statements
  size_t max_output_bytes = size_t{16} << 20;
  int max_depth = 64;  // nested macro calls
};

class ChatTemplate {
 public:
  // Parses `source`; a syntax error is an Error naming the line.
  explicit ChatTemplate(const std::string& source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders with the variables of `context` (a JSON object: messages, tools,
  // add_generation_prompt, bos_token, enable_thinking, ...). Template errors, including
  // raise_exception(), are Errors: "chat template: <message>".
  std::string render(const nlohmann::ordered_json& context, const RenderLimits& limits = {}) const;

 private:
  struct Parsed;
  std::unique_ptr<Parsed> parsed_;
};

}  // namespace deepinfer::chat

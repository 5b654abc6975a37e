// A model folder's chat template and the special tokens it is rendered with.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/template.h"

namespace deepinfer::chat {

// Which tool calls the client allows: any or none (kAuto), none offered (kNone), at least one
// (kRequired) or one call of the named function (kNamed).
struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kNamed };
  Mode mode = Mode::kAuto;
  std::string name;  // kNamed
};

struct ChatRequest {
  // ordered_json: templates see keys in the order the client sent them (tojson keeps it).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null when the request has none
  bool add_generation_prompt = false;
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();  // enable_thinking, ...
  ToolChoice tool_choice;
  bool json_output = false;  // response_format json_object: the answer is one JSON value
};

class ModelChatTemplate {
 public:
  // From `folder`: chat_template.jinja, else tokenizer_config.json's chat_template (a string,
  // or a list of {name, template} where `name` picks one; "default" when empty). Special tokens
  // come from tokenizer_config.json, falling back to config.json / generation_config.json ids
  // resolved through tokenizer.json. Error when the folder has no template.
  static ModelChatTemplate load(const std::filesystem::path& folder, const std::string& name = "");

  // As transformers' apply_chat_template(tokenize=False): messages, tools, documents (none),
  // add_generation_prompt, the special tokens and the request's variables.
  std::string render(const ChatRequest& request, const RenderLimits& limits = {}) const;
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  ModelChatTemplate(ChatTemplate parsed, nlohmann::ordered_json special_tokens)
      : template_(std::move(parsed)), special_tokens_(std::move(special_tokens)) {}
  ChatTemplate template_;
  nlohmann::ordered_json special_tokens_;
};

}  // namespace deepinfer::chat

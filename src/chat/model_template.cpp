#include "chat/model_template.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/json.h"

namespace deepinfer::chat {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json(const fs::path& path) {
  std::ifstream stream(path);
  if (!stream) return json();
  std::stringstream text;
  text << stream.rdbuf();
  json value = parse_json_or_discarded<json>(text.str());
  if (value.is_discarded()) fail("{}: malformed JSON", path.string());
  return value;
}

std::string read_text(const fs::path& path) {
  std::ifstream stream(path, std::ios::binary);
  std::stringstream text;
  text << stream.rdbuf();
  return text.str();
}

// tokenizer_config.json writes tokens as strings or {"content": ...}.
std::string token_text(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string())
    return value["content"].get<std::string>();
  return "";
}

// The content of token `id` from tokenizer.json's added tokens or vocabulary.
// A folder without tokenizer.json, or one of another shape, names no token.
std::string token_by_id(const json& tokenizer, int64_t id) {
  if (!tokenizer.is_object()) return "";
  auto added_tokens = tokenizer.find("added_tokens");
  if (added_tokens != tokenizer.end() && added_tokens->is_array()) {
    for (const json& added : *added_tokens) {
      if (!added.is_object()) continue;
      auto added_id = added.find("id");
      auto content = added.find("content");
      if (added_id != added.end() && added_id->is_number_integer() &&
          added_id->get<int64_t>() == id && content != added.end() && content->is_string())
        return content->get<std::string>();
    }
  }
  if (tokenizer.contains("model") && tokenizer["model"].is_object() &&
      tokenizer["model"].contains("vocab") && tokenizer["model"]["vocab"].is_object()) {
    for (const auto& [token, value] : tokenizer["model"]["vocab"].items()) {
      if (value.is_number_integer() && value.get<int64_t>() == id) return token;
    }
  }
  return "";
}

nlohmann::ordered_json special_tokens_of(const fs::path& folder, const json& config) {
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object();
  for (const char* key : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
    std::string text = config.is_object() && config.contains(key) ? token_text(config[key]) : "";
    if (!text.empty()) tokens[key] = text;
  }
  // Missing ones from the model's own config files, by id.
  json tokenizer;
  for (const char* file : {"generation_config.json", "config.json"}) {
    json model_config = read_json(folder / file);
    if (!model_config.is_object()) continue;
    for (const char* key : {"bos_token", "eos_token", "pad_token"}) {
      std::string id_key = std::string(key).substr(0, 3) + "_token_id";
      if (tokens.contains(key) || !model_config.contains(id_key)) continue;
      json id = model_config[id_key];
      if (id.is_array() && !id.empty()) id = id[0];
      if (!id.is_number_integer()) continue;
      if (tokenizer.is_null()) tokenizer = read_json(folder / "tokenizer.json");
      std::string text = token_by_id(tokenizer, id.get<int64_t>());
      if (!text.empty()) tokens[key] = text;
    }
  }
  return tokens;
}

std::string template_source(const fs::path& folder, const json& config, const std::string& name) {
  if (fs::exists(folder / "chat_template.jinja")) return read_text(folder / "chat_template.jinja");
  if (!config.is_object() || !config.contains("chat_template"))
    fail("{}: no chat template (chat_template.jinja or tokenizer_config.json)", folder.string());
  const json& value = config["chat_template"];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    std::string wanted = name.empty() ? "default" : name;
    for (const json& entry : value) {
      if (entry.value("name", "") == wanted) return entry.value("template", "");
    }
    fail("{}: tokenizer_config.json has no chat template named \"{}\"", folder.string(), wanted);
  }
  fail("{}: chat_template must be a string or a list of named templates", folder.string());
}

}  // namespace

ModelChatTemplate ModelChatTemplate::load(const fs::path& folder, const std::string& name) {
  json config = read_json(folder / "tokenizer_config.json");
  std::string source = template_source(folder, config, name);
  return ModelChatTemplate(ChatTemplate(source), special_tokens_of(folder, config));
}

std::string ModelChatTemplate::render(const ChatRequest& request,
                                      const RenderLimits& limits) const {
  if (!request.messages.is_array()) fail("chat: messages must be a list");
  nlohmann::ordered_json context = special_tokens_;
  context["messages"] = request.messages;
  context["tools"] = request.tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = request.add_generation_prompt;
  if (request.variables.is_object()) {
    for (const auto& [key, value] : request.variables.items()) context[key] = value;
  }
  return template_.render(context, limits);
}

}  // namespace deepinfer::chat

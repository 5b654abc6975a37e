#include "protocol/anthropic.h"

#include <fmt/format.h>

#include "core/json.h"

namespace deepinfer::protocol {
namespace {

std::string block_text(const Json& content, const char* where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw ApiError(400, fmt::format("{} must be a string or blocks", where));
  std::string text;
  for (const Json& block : content) {
    if (!block.is_object() || block.find("type") == block.end() || block["type"] != "text" ||
        !block.contains("text") || !block["text"].is_string())
      throw ApiError(400, fmt::format("{}: only text blocks are allowed here", where));
    if (!text.empty()) text += "\n";
    text += block["text"].get<std::string>();
  }
  return text;
}

// One Anthropic message as chat-template messages: text stays with its role, tool_use blocks
// become an assistant's tool_calls, tool_result blocks become "tool" messages.
void convert_message(const Json& message, size_t index, Json& out) {
  if (!message.is_object() || !message.contains("role") || !message["role"].is_string())
    throw ApiError(400, fmt::format("messages.{}: needs a 'role'", index), "messages");
  std::string role = message["role"].get<std::string>();
  if (role != "user" && role != "assistant")
    throw ApiError(400, fmt::format("messages.{}.role must be user or assistant", index),
                   "messages");
  const Json content = message.contains("content") ? message["content"] : Json(nullptr);
  if (content.is_string()) {
    out.push_back({{"role", role}, {"content", content}});
    return;
  }
  if (!content.is_array())
    throw ApiError(400, fmt::format("messages.{}.content must be a string or blocks", index),
                   "messages");
  std::string text;
  Json tool_calls = Json::array();
  for (const Json& block : content) {
    std::string where = fmt::format("messages.{}.content", index);
    std::string type = block.is_object() ? string_field(block, "type", where) : "";
    if (type == "text" && block.contains("text") && block["text"].is_string()) {
      text += (text.empty() ? "" : "\n") + block["text"].get<std::string>();
    } else if (type == "tool_use" && role == "assistant") {
      tool_calls.push_back({{"id", string_field(block, "id", where)},
                            {"type", "function"},
                            {"function",
                             {{"name", string_field(block, "name", where)},
                              {"arguments", block.value("input", Json::object())}}}});
    } else if (type == "tool_result" && role == "user") {
      out.push_back(
          {{"role", "tool"},
           {"tool_call_id", string_field(block, "tool_use_id", where)},
           {"content", block_text(block.value("content", Json("")), "tool_result.content")}});
    } else if (type == "thinking" || type == "redacted_thinking") {
      continue;  // earlier reasoning is not shown to the model again
    } else {
      throw ApiError(400, fmt::format("messages.{}: unsupported content block '{}'", index, type),
                     "messages");
    }
  }
  if (!text.empty() || !tool_calls.empty()) {
    Json converted = {{"role", role}, {"content", text}};
    if (!tool_calls.empty()) converted["tool_calls"] = tool_calls;
    out.push_back(std::move(converted));
  }
}

Json convert_tools(const Json& tools) {
  check_tools(tools);
  Json converted = Json::array();
  for (size_t t = 0; t < tools.size(); ++t) {
    const Json& tool = tools[t];
    if (!tool.is_object() || !tool.contains("name") || !tool["name"].is_string())
      throw ApiError(400, "each tool needs a string 'name'", "tools");
    converted.push_back(
        {{"type", "function"},
         {"function",
          {{"name", tool["name"]},
           {"description", string_field(tool, "description", fmt::format("tools[{}]", t))},
           {"parameters", tool.value("input_schema", Json::object())}}}});
    if (tool.contains("strict")) converted.back()["function"]["strict"] = tool["strict"];
  }
  return converted;
}

}  // namespace

MessagesRequest parse_messages(const std::string& body_text) {
  Json body = parse_json_object(body_text);
  MessagesRequest request;
  if (!body.contains("max_tokens") || !body["max_tokens"].is_number_integer())
    throw ApiError(400, "max_tokens: Field required (an integer)", "max_tokens");
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    throw ApiError(400, "messages: a non-empty array is required", "messages");
  if (body.contains("model") && body["model"].is_string()) request.model = body["model"];
  Json messages = Json::array();
  if (body.contains("system") && !body["system"].is_null())
    messages.push_back({{"role", "system"}, {"content", block_text(body["system"], "system")}});
  for (size_t i = 0; i < body["messages"].size(); ++i)
    convert_message(body["messages"][i], i, messages);
  request.chat.messages = messages;
  request.chat.add_generation_prompt = true;
  if (body.contains("tools") && !body["tools"].is_null())
    request.chat.tools = convert_tools(body["tools"]);
  if (auto choice = body.find("tool_choice"); choice != body.end() && !choice->is_null()) {
    using Mode = chat::ToolChoice::Mode;
    std::string type = choice->is_object() ? string_field(*choice, "type", "tool_choice") : "";
    chat::ToolChoice& parsed = request.chat.tool_choice;
    if (type == "none") parsed.mode = Mode::kNone;
    if (type == "any") parsed.mode = Mode::kRequired;
    if (type == "tool") {
      parsed.mode = Mode::kNamed;
      parsed.name = string_field(*choice, "name", "tool_choice");
    }
    if (type != "auto" && type != "none" && type != "any" && type != "tool")
      throw ApiError(400, "tool_choice.type must be auto, any, tool or none", "tool_choice");
    check_tool_choice(parsed, request.chat.tools);
    if (parsed.mode == Mode::kNone) request.chat.tools = nullptr;
  }
  if (auto thinking = body.find("thinking"); thinking != body.end() && thinking->is_object()) {
    bool enabled = string_field(*thinking, "type", "thinking") == "enabled";
    request.chat.variables["enable_thinking"] = enabled;
    request.chat.variables["thinking"] = enabled;
  }
  // The sampling fields share OpenAI's names, except stop_sequences; vLLM's ignore_eos is
  // taken here too.
  Json common = Json::object();
  for (const char* key : {"temperature", "top_p", "top_k", "stream", "max_tokens", "cache_salt",
                          "cache_retention", "ignore_eos"})
    if (body.contains(key)) common[key] = body[key];
  if (body.contains("stop_sequences")) common["stop"] = body["stop_sequences"];
  // Structured outputs: output_config.format (or the beta's output_format), {"type":
  // "json_schema", "schema": {...}}, read as the Responses API's text.format is.
  if (body.contains("output_format")) common["response_format"] = body["output_format"];
  const auto config = body.find("output_config");
  if (config != body.end()) {
    if (!config->is_object())
      throw ApiError(400, "output_config must be an object", "output_config");
    if (config->contains("format") && !(*config)["format"].is_null())
      common["response_format"] = (*config)["format"];
  }
  request.params = parse_generation_params(common, true);
  return request;
}

Json anthropic_error_body(const ApiError& error) {
  std::string type = error.status() == 401   ? "authentication_error"
                     : error.status() == 404 ? "not_found_error"
                     : error.status() == 413 ? "request_too_large"
                     : error.status() == 429 ? "rate_limit_error"
                     : error.status() >= 500 ? "api_error"
                                             : "invalid_request_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", error.what()}}}};
}

namespace {

std::string named_event(const char* name, const Json& payload) {
  return fmt::format("event: {}\ndata: {}\n\n", name, json_text(payload));
}

std::string stop_reason(const ChoiceOutput& choice) {
  if (!choice.tool_calls.empty() && choice.finish_reason != "length") return "tool_use";
  if (!choice.stop_reason.empty()) return "stop_sequence";
  return choice.finish_reason == "length" ? "max_tokens" : "end_turn";
}

Json tool_input(const ToolCall& call) {
  Json input = parse_json_or_discarded<Json>(call.arguments);
  return input.is_object() ? input : Json::object();
}

// Content blocks open and close in order: thinking, text and tool_use blocks as the parsed
// output switches between them.
class MessagesFormatter final : public ResponseFormatter {
 public:
  explicit MessagesFormatter(ResponseMeta meta) : meta_(std::move(meta)) {}

  std::string stream_start() override {
    Json message = envelope(Json::array(), nullptr, nullptr, 0);
    return named_event("message_start", {{"type", "message_start"}, {"message", message}}) +
           named_event("ping", {{"type", "ping"}});
  }
  std::string stream_text(int, const std::string& piece) override {
    return delta("text", {{"type", "text_delta"}, {"text", piece}});
  }
  std::string stream_parsed(int, const ParsedOutput& parsed) override {
    std::string out;
    if (!parsed.reasoning.empty())
      out += delta("thinking", {{"type", "thinking_delta"}, {"thinking", parsed.reasoning}});
    if (!parsed.content.empty())
      out += delta("text", {{"type", "text_delta"}, {"text", parsed.content}});
    for (const ToolCallPiece& piece : parsed.call_pieces) {
      if (piece.opens) {
        out += open("tool_use", {{"type", "tool_use"},
                                 {"id", piece.id},
                                 {"name", piece.name},
                                 {"input", Json::object()}});
      }
      if (!piece.arguments.empty()) {
        out += named_event(
            "content_block_delta",
            {{"type", "content_block_delta"},
             {"index", index_},
             {"delta", {{"type", "input_json_delta"}, {"partial_json", piece.arguments}}}});
      }
      if (piece.closes) out += close();
    }
    return out;
  }
  std::string stream_finish(const ChoiceOutput& choice, const std::string& tail) override {
    last_ = choice;
    return tail.empty() ? "" : stream_text(0, tail);
  }
  std::string stream_end(const Usage& usage) override {
    std::string out =
        open_kind_.empty() && index_ < 0 ? open("text", {{"type", "text"}, {"text", ""}}) : "";
    out += close();
    Json delta_fields = {
        {"stop_reason", stop_reason(last_)},
        {"stop_sequence", last_.stop_reason.empty() ? Json(nullptr) : Json(last_.stop_reason)}};
    return out +
           named_event("message_delta", {{"type", "message_delta"},
                                         {"delta", delta_fields},
                                         {"usage", {{"output_tokens", usage.completion_tokens}}}}) +
           named_event("message_stop", {{"type", "message_stop"}});
  }
  Json whole(const std::vector<ChoiceOutput>& choices, const Usage& usage) override {
    const ChoiceOutput& choice = choices.front();
    Json content = Json::array();
    if (!choice.reasoning.empty())
      content.push_back({{"type", "thinking"}, {"thinking", choice.reasoning}, {"signature", ""}});
    if (!choice.text.empty() || choice.tool_calls.empty())
      content.push_back({{"type", "text"}, {"text", choice.text}});
    for (const ToolCall& call : choice.tool_calls) {
      content.push_back({{"type", "tool_use"},
                         {"id", call.id},
                         {"name", call.name},
                         {"input", tool_input(call)}});
    }
    return envelope(content, stop_reason(choice),
                    choice.stop_reason.empty() ? Json(nullptr) : Json(choice.stop_reason),
                    usage.completion_tokens, usage.cached_tokens);
  }
  Json error_body(const ApiError& error) const override { return anthropic_error_body(error); }
  // Anthropic's clients raise on an error event; nothing follows it.
  std::string stream_error(const ApiError& error) override {
    return named_event("error", anthropic_error_body(error));
  }

 private:
  Json envelope(const Json& content, const Json& reason, const Json& sequence, int64_t output,
                int64_t cached = 0) const {
    return {{"id", meta_.id},
            {"type", "message"},
            {"role", "assistant"},
            {"model", meta_.model},
            {"content", content},
            {"stop_reason", reason},
            {"stop_sequence", sequence},
            {"usage",
             {{"input_tokens", meta_.prompt_tokens - cached},
              {"output_tokens", output},
              {"cache_read_input_tokens", cached},
              {"cache_creation_input_tokens", 0}}}};
  }
  // A delta for a block of `kind`, opening one (and closing the previous) when needed.
  std::string delta(const char* kind, Json fields) {
    std::string out;
    if (open_kind_ != kind) {
      Json block = std::string(kind) == "thinking"
                       ? Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                       : Json{{"type", "text"}, {"text", ""}};
      out += open(kind, block);
    }
    return out + named_event("content_block_delta", {{"type", "content_block_delta"},
                                                     {"index", index_},
                                                     {"delta", std::move(fields)}});
  }
  std::string open(const char* kind, const Json& block) {
    std::string out = close();
    open_kind_ = kind;
    ++index_;
    return out + named_event("content_block_start", {{"type", "content_block_start"},
                                                     {"index", index_},
                                                     {"content_block", block}});
  }
  std::string close() {
    if (open_kind_.empty()) return "";
    open_kind_.clear();
    return named_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
  }

  ResponseMeta meta_;
  ChoiceOutput last_;
  std::string open_kind_;  // the block being streamed ("" none)
  int index_ = -1;         // its index
};

}  // namespace

std::unique_ptr<ResponseFormatter> make_anthropic_formatter(ResponseMeta meta) {
  return std::make_unique<MessagesFormatter>(std::move(meta));
}

}  // namespace deepinfer::protocol

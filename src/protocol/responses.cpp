#include "protocol/responses.h"

#include <fmt/format.h>

#include "core/json.h"

namespace deepinfer::protocol {
namespace {

std::string item_text(const Json& content, size_t index) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    throw ApiError(400, fmt::format("input[{}].content must be a string or parts", index), "input");
  std::string text;
  for (const Json& part : content) {
    std::string type =
        part.is_object() ? string_field(part, "type", fmt::format("input[{}].content", index)) : "";
    if ((type != "input_text" && type != "output_text" && type != "text") ||
        !part.contains("text") || !part["text"].is_string()) {
      throw ApiError(400, fmt::format("input[{}]: only text parts are supported", index), "input");
    }
    if (!text.empty()) text += "\n";
    text += part["text"].get<std::string>();
  }
  return text;
}

// Input items as chat-template messages: messages keep their role, function calls become an
// assistant's tool_calls and their outputs "tool" messages.
Json convert_input(const Json& input) {
  Json messages = Json::array();
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return messages;
  }
  if (!input.is_array() || input.empty())
    throw ApiError(400, "'input' must be a string or a non-empty array of items", "input");
  for (size_t i = 0; i < input.size(); ++i) {
    const Json& item = input[i];
    std::string where = fmt::format("input[{}]", i);
    std::string type = item.is_object() ? string_field(item, "type", where, "message") : "";
    if (type == "message") {
      std::string role = string_field(item, "role", where);
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        throw ApiError(400, fmt::format("input[{}].role '{}' is not a known role", i, role),
                       "input");
      messages.push_back({{"role", role == "developer" ? "system" : role},
                          {"content", item_text(item.value("content", Json("")), i)}});
    } else if (type == "function_call") {
      Json arguments = parse_json_or_discarded<Json>(string_field(item, "arguments", where, "{}"));
      messages.push_back(
          {{"role", "assistant"},
           {"content", ""},
           {"tool_calls",
            Json::array(
                {{{"id", string_field(item, "call_id", where)},
                  {"type", "function"},
                  {"function",
                   {{"name", string_field(item, "name", where)},
                    {"arguments", arguments.is_discarded() ? Json::object() : arguments}}}}})}});
    } else if (type == "function_call_output") {
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", string_field(item, "call_id", where)},
                          {"content", string_field(item, "output", where)}});
    } else {
      throw ApiError(400, fmt::format("input[{}]: item type '{}' is not supported", i, type),
                     "input");
    }
  }
  return messages;
}

}  // namespace

ResponsesRequest parse_responses(const std::string& body_text) {
  Json body = parse_json_object(body_text);
  ResponsesRequest request;
  if (body.contains("model") && body["model"].is_string()) request.model = body["model"];
  if (body.contains("previous_response_id") && !body["previous_response_id"].is_null())
    throw ApiError(400, "previous_response_id is not supported: this server stores no responses",
                   "previous_response_id");
  if (!body.contains("input")) throw ApiError(400, "'input' is required", "input");
  Json messages = Json::array();
  if (std::string instructions = string_field(body, "instructions", ""); !instructions.empty())
    messages.push_back({{"role", "system"}, {"content", instructions}});
  for (Json& message : convert_input(body["input"])) messages.push_back(std::move(message));
  request.chat.messages = messages;
  request.chat.add_generation_prompt = true;
  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null())
    check_tools(*tools);
  if (auto tools = body.find("tools");
      tools != body.end() && tools->is_array() && !tools->empty()) {
    Json converted = Json::array();
    for (size_t t = 0; t < tools->size(); ++t) {
      const Json& tool = (*tools)[t];
      std::string where = fmt::format("tools[{}]", t);
      if (!tool.is_object() || string_field(tool, "type", where) != "function")
        throw ApiError(400, "only function tools are supported", "tools");
      converted.push_back({{"type", "function"},
                           {"function",
                            {{"name", string_field(tool, "name", where)},
                             {"description", string_field(tool, "description", where)},
                             {"parameters", tool.value("parameters", Json::object())}}}});
      if (tool.contains("strict")) converted.back()["function"]["strict"] = tool["strict"];
    }
    request.chat.tools = converted;
  }
  if (auto choice = body.find("tool_choice"); choice != body.end())
    request.chat.tool_choice = parse_tool_choice(*choice, request.chat.tools);
  if (request.chat.tool_choice.mode == chat::ToolChoice::Mode::kNone) request.chat.tools = nullptr;
  if (auto reasoning = body.find("reasoning"); reasoning != body.end() && reasoning->is_object())
    request.chat.variables["reasoning_effort"] =
        string_field(*reasoning, "effort", "reasoning", "medium");
  Json common = Json::object();
  for (const char* key :
       {"temperature", "top_p", "stream", "seed", "cache_salt", "cache_retention", "ignore_eos"})
    if (body.contains(key)) common[key] = body[key];
  if (body.contains("max_output_tokens")) common["max_tokens"] = body["max_output_tokens"];
  if (auto text = body.find("text");
      text != body.end() && text->is_object() && text->contains("format"))
    common["response_format"] = (*text)["format"];
  request.params = parse_generation_params(common, true);
  return request;
}

namespace {

// Output items open and close in order (reasoning, message, function calls) as the parsed
// output switches between them; every event carries a rising sequence_number.
class ResponsesFormatter final : public ResponseFormatter {
 public:
  explicit ResponsesFormatter(ResponseMeta meta)
      : meta_(std::move(meta)), suffix_(meta_.id.substr(meta_.id.find('_') + 1)) {}

  std::string stream_start() override {
    Json started = response("in_progress", Json::array(), Usage{});
    std::string out = event("response.created", {{"response", started}});  // numbered in order
    return out + event("response.in_progress", {{"response", started}});
  }
  std::string stream_text(int, const std::string& piece) override {
    ParsedOutput text;
    text.content = piece;
    return stream_parsed(0, text);
  }
  std::string stream_parsed(int, const ParsedOutput& parsed) override {
    std::string out;
    if (!parsed.reasoning.empty()) {
      out += open("reasoning");
      text_ += parsed.reasoning;
      out += event("response.reasoning_text.delta", {{"item_id", item_id()},
                                                     {"output_index", index_},
                                                     {"content_index", 0},
                                                     {"delta", parsed.reasoning}});
    }
    if (!parsed.content.empty()) {
      out += open("message");
      text_ += parsed.content;
      out += event("response.output_text.delta", {{"item_id", item_id()},
                                                  {"output_index", index_},
                                                  {"content_index", 0},
                                                  {"delta", parsed.content},
                                                  {"logprobs", Json::array()}});
    }
    for (const ToolCallPiece& piece : parsed.call_pieces) {
      if (piece.opens) {
        out += close();
        ++index_;
        kind_ = "function_call";
        call_ = {piece.id, piece.name, ""};
        out += event("response.output_item.added",
                     {{"output_index", index_}, {"item", item("in_progress", "")}});
      }
      if (!piece.arguments.empty()) {
        call_.arguments += piece.arguments;
        out +=
            event("response.function_call_arguments.delta",
                  {{"item_id", item_id()}, {"output_index", index_}, {"delta", piece.arguments}});
      }
      if (piece.closes) out += close();
    }
    return out;
  }
  std::string stream_finish(const ChoiceOutput& choice, const std::string& tail) override {
    finish_ = choice.finish_reason;
    return tail.empty() ? "" : stream_text(0, tail);
  }
  std::string stream_end(const Usage& usage) override {
    std::string out = kind_.empty() && index_ < 0 ? open("message") : "";
    out += close();
    return out + event("response.completed", {{"response", response(status(), done_, usage)}});
  }
  // An error event, then response.failed, the terminal event clients wait for.
  std::string stream_error(const ApiError& error) override {
    std::string code = error.status() >= 500 ? "server_error" : "invalid_request";
    Json failed = response("failed", done_, Usage{});
    failed["error"] = {{"code", code}, {"message", error.what()}};
    return event("error", {{"code", code}, {"message", error.what()}, {"param", nullptr}}) +
           event("response.failed", {{"response", failed}});
  }
  Json whole(const std::vector<ChoiceOutput>& choices, const Usage& usage) override {
    const ChoiceOutput& choice = choices.front();
    finish_ = choice.finish_reason;
    Json output = Json::array();
    auto add = [&](const char* kind, const std::string& text) {
      kind_ = kind;
      ++index_;
      output.push_back(item("completed", text));
    };
    if (!choice.reasoning.empty()) add("reasoning", choice.reasoning);
    if (!choice.text.empty() || choice.tool_calls.empty()) add("message", choice.text);
    for (const ToolCall& call : choice.tool_calls) {
      call_ = call;
      add("function_call", "");
    }
    return response(status(), output, usage);
  }

 private:
  std::string status() const { return finish_ == "length" ? "incomplete" : "completed"; }
  std::string item_id() const {
    const char* prefix = kind_ == "reasoning" ? "rs_" : kind_ == "message" ? "msg_" : "fc_";
    return fmt::format("{}{}_{}", prefix, suffix_, index_);
  }

  // Opens an item of `kind` unless one is open already (closing the previous one).
  std::string open(const char* kind) {
    if (kind_ == kind) return "";
    std::string out = close();
    kind_ = kind;
    ++index_;
    text_.clear();
    out += event("response.output_item.added",
                 {{"output_index", index_}, {"item", item("in_progress", "")}});
    if (kind_ == "message") {
      out += event("response.content_part.added", {{"item_id", item_id()},
                                                   {"output_index", index_},
                                                   {"content_index", 0},
                                                   {"part", text_part("output_text", "")}});
    }
    return out;
  }
  std::string close() {
    if (kind_.empty()) return "";
    std::string out;
    Json where = {{"item_id", item_id()}, {"output_index", index_}};
    if (kind_ == "reasoning") {
      Json fields = where;
      fields.update({{"content_index", 0}, {"text", text_}});
      out += event("response.reasoning_text.done", fields);
    } else if (kind_ == "message") {
      Json fields = where;
      fields.update({{"content_index", 0}, {"text", text_}, {"logprobs", Json::array()}});
      out += event("response.output_text.done", fields);
      fields = where;
      fields.update({{"content_index", 0}, {"part", text_part("output_text", text_)}});
      out += event("response.content_part.done", fields);
    } else {
      Json fields = where;
      fields["arguments"] = call_.arguments;
      out += event("response.function_call_arguments.done", fields);
    }
    Json finished = item("completed", text_);
    done_.push_back(finished);
    out += event("response.output_item.done", {{"output_index", index_}, {"item", finished}});
    kind_.clear();
    return out;
  }

  static Json text_part(const char* type, const std::string& text) {
    Json part = {{"type", type}, {"text", text}};
    if (std::string(type) == "output_text") part["annotations"] = Json::array();
    return part;
  }
  Json item(const char* item_status, const std::string& text) const {
    bool completed = std::string(item_status) == "completed";
    if (kind_ == "function_call") {
      return {{"type", "function_call"},
              {"id", item_id()},
              {"call_id", call_.id},
              {"name", call_.name},
              {"arguments", completed ? call_.arguments : ""},
              {"status", item_status}};
    }
    if (kind_ == "reasoning") {
      Json content = Json::array();
      if (completed) content.push_back(text_part("reasoning_text", text));
      return {{"type", "reasoning"},
              {"id", item_id()},
              {"summary", Json::array()},
              {"content", content}};
    }
    Json content = Json::array();
    if (completed) content.push_back(text_part("output_text", text));
    return {{"type", "message"},
            {"id", item_id()},
            {"status", item_status},
            {"role", "assistant"},
            {"content", content}};
  }
  std::string event(const char* type, Json fields) {
    Json payload = {{"type", type}, {"sequence_number", sequence_++}};
    payload.update(fields);
    return fmt::format("event: {}\ndata: {}\n\n", type, json_text(payload));
  }
  Json response(const std::string& state, const Json& output, const Usage& usage) const {
    return {{"id", meta_.id},
            {"object", "response"},
            {"created_at", meta_.created},
            {"status", state},
            {"error", nullptr},
            {"incomplete_details",
             state == "incomplete" ? Json{{"reason", "max_output_tokens"}} : Json(nullptr)},
            {"instructions", nullptr},
            {"model", meta_.model},
            {"output", output},
            {"parallel_tool_calls", true},
            {"tool_choice", "auto"},
            {"tools", Json::array()},
            {"text", {{"format", {{"type", "text"}}}}},
            {"metadata", Json::object()},
            {"usage",
             {{"input_tokens", usage.prompt_tokens},
              {"input_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
              {"output_tokens", usage.completion_tokens},
              {"output_tokens_details", {{"reasoning_tokens", 0}}},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens}}}};
  }

  ResponseMeta meta_;
  std::string suffix_;
  std::string kind_;  // the open item's type ("" none)
  int index_ = -1;    // its output_index
  std::string text_;  // its text so far
  ToolCall call_;     // the function call item's call
  Json done_ = Json::array();
  std::string finish_;
  int64_t sequence_ = 0;
};

}  // namespace

std::unique_ptr<ResponseFormatter> make_responses_formatter(ResponseMeta meta) {
  return std::make_unique<ResponsesFormatter>(std::move(meta));
}

}  // namespace deepinfer::protocol

#include "protocol/responses.h"

#include <fmt/format.h>

namespace deepinfer::protocol {
namespace {

std::string item_text(const Json& content, size_t index) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    throw ApiError(400, fmt::format("input[{}].content must be a string or parts", index), "input");
  std::string text;
  for (const Json& part : content) {
    std::string type = part.is_object() ? part.value("type", "") : "";
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
    std::string type = item.is_object() ? item.value("type", "message") : "";
    if (type == "message") {
      std::string role = item.value("role", "");
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        throw ApiError(400, fmt::format("input[{}].role '{}' is not a known role", i, role),
                       "input");
      messages.push_back({{"role", role == "developer" ? "system" : role},
                          {"content", item_text(item.value("content", Json("")), i)}});
    } else if (type == "function_call") {
      Json arguments = Json::parse(item.value("arguments", "{}"), nullptr, false);
      messages.push_back(
          {{"role", "assistant"},
           {"content", ""},
           {"tool_calls",
            Json::array(
                {{{"id", item.value("call_id", "")},
                  {"type", "function"},
                  {"function",
                   {{"name", item.value("name", "")},
                    {"arguments", arguments.is_discarded() ? Json::object() : arguments}}}}})}});
    } else if (type == "function_call_output") {
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", item.value("call_id", "")},
                          {"content", item.value("output", "")}});
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
  if (body.contains("instructions") && body["instructions"].is_string())
    messages.push_back({{"role", "system"}, {"content", body["instructions"]}});
  for (Json& message : convert_input(body["input"])) messages.push_back(std::move(message));
  request.chat.messages = messages;
  request.chat.add_generation_prompt = true;
  if (auto tools = body.find("tools");
      tools != body.end() && tools->is_array() && !tools->empty()) {
    Json converted = Json::array();
    for (const Json& tool : *tools) {
      if (tool.value("type", "") != "function")
        throw ApiError(400, "only function tools are supported", "tools");
      converted.push_back({{"type", "function"},
                           {"function",
                            {{"name", tool.value("name", "")},
                             {"description", tool.value("description", "")},
                             {"parameters", tool.value("parameters", Json::object())}}}});
    }
    request.chat.tools = converted;
  }
  if (auto reasoning = body.find("reasoning"); reasoning != body.end() && reasoning->is_object())
    request.chat.variables["reasoning_effort"] = reasoning->value("effort", "medium");
  Json common = Json::object();
  for (const char* key : {"temperature", "top_p", "stream", "seed"})
    if (body.contains(key)) common[key] = body[key];
  if (body.contains("max_output_tokens")) common["max_tokens"] = body["max_output_tokens"];
  if (auto text = body.find("text");
      text != body.end() && text->is_object() && text->contains("format"))
    common["response_format"] = (*text)["format"];
  request.params = parse_generation_params(common, true);
  return request;
}

namespace {

class ResponsesFormatter final : public ResponseFormatter {
 public:
  explicit ResponsesFormatter(ResponseMeta meta)
      : meta_(std::move(meta)), item_id_("msg_" + meta_.id.substr(meta_.id.find('_') + 1)) {}

  std::string stream_start() override {
    Json started = response("in_progress", Json::array(), Usage{}, "");
    return event("response.created", {{"response", started}}) +
           event("response.in_progress", {{"response", started}}) +
           event("response.output_item.added",
                 {{"output_index", 0}, {"item", message_item("in_progress", "")}}) +
           event("response.content_part.added", part_fields("", "part"));
  }
  std::string stream_text(int, const std::string& piece) override {
    text_ += piece;
    Json fields = part_fields(piece, "delta");
    fields["logprobs"] = Json::array();
    return event("response.output_text.delta", fields);
  }
  std::string stream_finish(const ChoiceOutput& choice, const std::string& tail) override {
    finish_ = choice.finish_reason;
    std::string out = tail.empty() ? "" : stream_text(0, tail);
    Json done = part_fields(text_, "text");
    done["logprobs"] = Json::array();
    return out + event("response.output_text.done", done) +
           event("response.content_part.done", part_fields(text_, "part")) +
           event("response.output_item.done",
                 {{"output_index", 0}, {"item", message_item("completed", text_)}});
  }
  std::string stream_end(const Usage& usage) override {
    Json output = Json::array({message_item("completed", text_)});
    return event("response.completed", {{"response", response(status(), output, usage, finish_)}});
  }
  Json whole(const std::vector<ChoiceOutput>& choices, const Usage& usage) override {
    finish_ = choices.front().finish_reason;
    Json output = Json::array({message_item("completed", choices.front().text)});
    return response(status(), output, usage, finish_);
  }

 private:
  std::string status() const { return finish_ == "length" ? "incomplete" : "completed"; }

  std::string event(const char* type, Json fields) {
    Json payload = {{"type", type}, {"sequence_number", sequence_++}};
    payload.update(fields);
    return fmt::format("event: {}\ndata: {}\n\n", type,
                       payload.dump(-1, ' ', false, Json::error_handler_t::replace));
  }
  // The fields that locate the one text part; `key` holds `text` (a part object for "part").
  Json part_fields(const std::string& text, const char* key) const {
    Json fields = {{"item_id", item_id_}, {"output_index", 0}, {"content_index", 0}};
    if (std::string(key) == "part") {
      fields["part"] = {{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}};
    } else {
      fields[key] = text;
    }
    return fields;
  }
  Json message_item(const char* item_status, const std::string& text) const {
    Json content = Json::array();
    if (std::string(item_status) == "completed")
      content.push_back({{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}});
    return {{"type", "message"},
            {"id", item_id_},
            {"status", item_status},
            {"role", "assistant"},
            {"content", content}};
  }
  Json response(const std::string& state, const Json& output, const Usage& usage,
                const std::string& finish) const {
    Json incomplete = finish == "length" ? Json{{"reason", "max_output_tokens"}} : Json(nullptr);
    return {{"id", meta_.id},
            {"object", "response"},
            {"created_at", meta_.created},
            {"status", state},
            {"error", nullptr},
            {"incomplete_details", state == "incomplete" ? incomplete : Json(nullptr)},
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
  std::string item_id_;
  std::string text_;
  std::string finish_;
  int64_t sequence_ = 0;
};

}  // namespace

std::unique_ptr<ResponseFormatter> make_responses_formatter(ResponseMeta meta) {
  return std::make_unique<ResponsesFormatter>(std::move(meta));
}

}  // namespace deepinfer::protocol

#include "protocol/openai.h"

#include <fmt/format.h>

#include <limits>

#include "core/json.h"
#include "protocol/limits.h"

namespace deepinfer::protocol {

ApiError::ApiError(int status, const std::string& message, std::string param, std::string type)
    : std::runtime_error(message),
      status_(status),
      param_(std::move(param)),
      type_(type.empty() ? (status == 401   ? "authentication_error"
                            : status == 404 ? "not_found_error"
                            : status == 429 ? "rate_limit_error"
                            : status >= 500 ? "server_error"
                                            : "invalid_request_error")
                         : std::move(type)) {}

Json openai_error_body(const ApiError& error) {
  return {{"error",
           {{"message", error.what()},
            {"type", error.type()},
            {"param", error.param().empty() ? Json(nullptr) : Json(error.param())},
            {"code", error.status()}}}};
}

Json parse_json_object(const std::string& body) {
  Json parsed;
  switch (parse_json(body, parsed)) {
    case JsonParse::kInvalid:
      throw ApiError(400, "the request body is not valid JSON");
    case JsonParse::kTooDeep:
      throw ApiError(400, fmt::format("the request body nests arrays and objects deeper than {} "
                                      "levels",
                                      kMaxJsonDepth));
    case JsonParse::kOk:
      break;
  }
  if (!parsed.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return parsed;
}

const char* json_type_name(const Json& value) {
  return value.is_number_integer() ? "an integer"
         : value.is_number()       ? "a number"
                                   : value.type_name();
}

int64_t checked_integer(const Json& value, const std::string& field, int64_t lowest,
                        int64_t highest) {
  // Unsigned values above INT64_MAX compare as large, not as their wrapped signed selves.
  bool in_range = value.is_number_integer() &&
                  (value.is_number_unsigned()
                       ? value.get<uint64_t>() <= static_cast<uint64_t>(highest) && highest >= 0
                       : value.get<int64_t>() >= lowest && value.get<int64_t>() <= highest);
  if (!in_range) {
    throw ApiError(
        400,
        value.is_number_integer()
            ? fmt::format("'{}' must be in [{}, {}]", field, lowest, highest)
            : fmt::format("'{}' must be an integer, not {}", field, json_type_name(value)),
        field);
  }
  return value.get<int64_t>();
}

std::string string_field(const Json& object, const char* key, const std::string& where,
                         const std::string& fallback) {
  auto found = object.find(key);
  if (found == object.end() || found->is_null()) return fallback;
  if (!found->is_string()) {
    std::string path = where.empty() ? key : where + "." + key;
    throw ApiError(400, fmt::format("'{}' must be a string, not {}", path, json_type_name(*found)),
                   path.substr(0, path.find_first_of(".[")));
  }
  return found->get<std::string>();
}

std::vector<int32_t> read_token_ids(const Json& value, const std::string& field) {
  if (!value.is_array())
    throw ApiError(400, fmt::format("'{}' must be an array of token ids", field), field);
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (const Json& id : value)
    ids.push_back(
        static_cast<int32_t>(checked_integer(id, field, 0, std::numeric_limits<int32_t>::max())));
  return ids;
}

namespace {

// Reads an optional field of one JSON type; a wrong type, or an integer outside what the field
// holds, is a 400 naming the field.
template <typename T>
bool read(const Json& body, const char* key, T& target) {
  auto found = body.find(key);
  if (found == body.end() || found->is_null()) return false;
  if constexpr (std::is_same_v<T, bool>) {
    if (found->is_boolean()) return target = found->get<bool>(), true;
  } else if constexpr (std::is_integral_v<T>) {
    target = static_cast<T>(
        checked_integer(*found, key, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
    return true;
  } else if constexpr (std::is_floating_point_v<T>) {
    if (found->is_number()) return target = found->get<T>(), true;
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (found->is_string()) return target = found->get<std::string>(), true;
  } else {
    try {
      target = found->get<T>();
      return true;
    } catch (const nlohmann::json::exception&) {
    }
  }
  throw ApiError(400, fmt::format("'{}' has the wrong type ({})", key, json_type_name(*found)),
                 key);
}

std::vector<std::string> read_stop(const Json& body) {
  std::vector<std::string> stops;
  auto found = body.find("stop");
  if (found == body.end() || found->is_null()) return stops;
  if (found->is_string()) {
    stops.push_back(found->get<std::string>());
  } else if (found->is_array() && std::all_of(found->begin(), found->end(),
                                              [](const Json& s) { return s.is_string(); })) {
    for (const Json& stop : *found) stops.push_back(stop.get<std::string>());
  } else {
    throw ApiError(400, "'stop' must be a string or an array of strings", "stop");
  }
  if (stops.size() > RequestLimits::kStopStrings) {
    throw ApiError(
        400, fmt::format("'stop' holds more than {} strings", RequestLimits::kStopStrings), "stop");
  }
  for (const std::string& stop : stops) {
    if (stop.empty()) throw ApiError(400, "'stop' strings must not be empty", "stop");
    if (stop.size() > RequestLimits::kStopStringBytes) {
      throw ApiError(
          400,
          fmt::format("'stop' strings must be at most {} bytes", RequestLimits::kStopStringBytes),
          "stop");
    }
  }
  return stops;
}

void read_logit_bias(const Json& body, sampling::SamplingParams& p) {
  auto found = body.find("logit_bias");
  if (found == body.end() || found->is_null()) return;
  if (!found->is_object()) throw ApiError(400, "'logit_bias' must be an object", "logit_bias");
  if (found->size() > RequestLimits::kLogitBias) {
    throw ApiError(
        400, fmt::format("'logit_bias' holds more than {} entries", RequestLimits::kLogitBias),
        "logit_bias");
  }
  for (const auto& [token, bias] : found->items()) {
    size_t end = 0;
    int32_t id = -1;
    try {
      id = std::stoi(token, &end);
    } catch (const std::exception&) {
      end = 0;
    }
    if (end != token.size() || id < 0 || !bias.is_number())
      throw ApiError(400, "'logit_bias' maps token ids to numbers", "logit_bias");
    p.logit_bias.emplace_back(id, bias.get<float>());
  }
}

// text: free output; json_object: one JSON object; json_schema: one JSON value its schema
// accepts ({type, json_schema: {name, schema, strict}} in Chat and Completions; the Responses
// API's text.format puts name and schema beside type). Enforced token by token.
void read_response_format(const Json& body, GenerationParams& params) {
  auto found = body.find("response_format");
  if (found == body.end() || found->is_null()) return;
  std::string type = found->is_object() ? string_field(*found, "type", "response_format") : "";
  if (type == "text") return;
  if (type == "json_object") {
    params.json_output = true;
    return;
  }
  if (type == "json_schema") {
    const Json* holder = &*found;
    if (auto nested = found->find("json_schema"); nested != found->end()) {
      if (!nested->is_object())
        throw ApiError(400, "'response_format.json_schema' must be an object", "response_format");
      holder = &*nested;
    }
    auto schema = holder->find("schema");
    if (schema == holder->end())
      throw ApiError(400, "response_format json_schema needs its 'schema'", "response_format");
    params.structured.json_schema =
        read_schema(*schema, "response_format.json_schema.schema", "response_format");
    params.structured.field = "response_format";
    return;
  }
  throw ApiError(400,
                 fmt::format("response_format '{}' is not supported: 'text', 'json_object' and "
                             "'json_schema' are",
                             type),
                 "response_format");
}

}  // namespace

bool bool_field(const Json& object, const char* key, bool fallback) {
  bool value = fallback;
  read(object, key, value);
  return value;
}

void check_tools(const Json& tools) {
  if (!tools.is_array()) throw ApiError(400, "'tools' must be an array", "tools");
  if (tools.size() > RequestLimits::kTools)
    throw ApiError(400, fmt::format("'tools' holds more than {} tools", RequestLimits::kTools),
                   "tools");
  if (tools.dump().size() > RequestLimits::kToolsBytes) {
    throw ApiError(400,
                   fmt::format("'tools' is more than {} bytes of JSON", RequestLimits::kToolsBytes),
                   "tools");
  }
}

chat::ToolChoice parse_tool_choice(const Json& choice, const Json& tools) {
  using Mode = chat::ToolChoice::Mode;
  chat::ToolChoice parsed;
  if (choice.is_null() || choice == "auto") return parsed;
  if (choice == "none") {
    parsed.mode = Mode::kNone;
    return parsed;
  }
  if (choice == "required") {
    parsed.mode = Mode::kRequired;
  } else if (choice.is_object() && string_field(choice, "type", "tool_choice") == "function") {
    // Chat nests the name in "function"; Responses puts it beside "type".
    const Json& function = choice.contains("function") ? choice["function"] : choice;
    if (!function.is_object() || !function.contains("name") || !function["name"].is_string())
      throw ApiError(400, "a named tool_choice needs the function's name", "tool_choice");
    parsed.mode = Mode::kNamed;
    parsed.name = function["name"].get<std::string>();
  } else {
    throw ApiError(400, "tool_choice must be 'none', 'auto', 'required' or a named function",
                   "tool_choice");
  }
  check_tool_choice(parsed, tools);
  return parsed;
}

void check_tool_choice(const chat::ToolChoice& choice, const Json& tools) {
  using Mode = chat::ToolChoice::Mode;
  if (choice.mode != Mode::kRequired && choice.mode != Mode::kNamed) return;
  if (!tools.is_array() || tools.empty())
    throw ApiError(400, "tool_choice asks for a tool call but the request has no tools",
                   "tool_choice");
  if (choice.mode == Mode::kRequired) return;
  for (const Json& tool : tools) {
    const Json& function = tool.contains("function") ? tool["function"] : tool;
    if (function.is_object() && function.contains("name") && function["name"] == choice.name)
      return;
  }
  throw ApiError(400,
                 fmt::format("tool_choice names '{}', which is not among the tools", choice.name),
                 "tool_choice");
}

GenerationParams parse_generation_params(const Json& body, bool chat) {
  GenerationParams params;
  sampling::SamplingParams& p = params.sampling;
  read(body, "temperature", p.temperature);
  read(body, "top_p", p.top_p);
  read(body, "top_k", p.top_k);
  read(body, "min_p", p.min_p);
  read(body, "presence_penalty", p.presence_penalty);
  read(body, "frequency_penalty", p.frequency_penalty);
  read(body, "repetition_penalty", p.repetition_penalty);
  int64_t seed = 0;
  if (read(body, "seed", seed)) p.seed = static_cast<uint64_t>(seed);
  read(body, "n", p.n);
  read_logit_bias(body, p);
  if (chat) {
    read(body, "logprobs", p.logprobs);
    read(body, "top_logprobs", p.top_logprobs);
  } else {
    int logprobs = -1;
    if (read(body, "logprobs", logprobs)) {
      if (logprobs < 0 || logprobs > RequestLimits::kTopLogprobs) {
        throw ApiError(400,
                       fmt::format("'logprobs' must be in [0, {}]", RequestLimits::kTopLogprobs),
                       "logprobs");
      }
      p.logprobs = true;
      p.top_logprobs = logprobs;
    }
  }
  int max_tokens = 0;
  if (read(body, "max_completion_tokens", max_tokens) || read(body, "max_tokens", max_tokens)) {
    if (max_tokens < 1) throw ApiError(400, "'max_tokens' must be at least 1", "max_tokens");
    params.max_tokens = max_tokens;
  }
  read(body, "min_tokens", params.min_tokens);
  read(body, "ignore_eos", params.ignore_eos);
  if (auto ids = body.find("stop_token_ids"); ids != body.end() && !ids->is_null()) {
    params.stop_token_ids = read_token_ids(*ids, "stop_token_ids");
    if (params.stop_token_ids.size() > RequestLimits::kStopTokenIds) {
      throw ApiError(
          400, fmt::format("'stop_token_ids' holds more than {} ids", RequestLimits::kStopTokenIds),
          "stop_token_ids");
    }
  }
  read(body, "priority", params.priority);
  params.cache_salt = string_field(body, "cache_salt", "");
  params.cache_retention = string_field(body, "cache_retention", "");
  read(body, "stream", params.stream);
  params.stop = read_stop(body);
  if (auto options = body.find("stream_options"); options != body.end() && !options->is_null()) {
    // As OpenAI and vLLM: stream options belong to a stream.
    if (!options->is_object())
      throw ApiError(400, "'stream_options' must be an object", "stream_options");
    if (!params.stream)
      throw ApiError(400, "'stream_options' is only allowed when 'stream' is true",
                     "stream_options");
    read(*options, "include_usage", params.include_usage);
  }
  (void)string_field(body, "user", "");  // accepted for the client's records, never used
  read_response_format(body, params);
  read_structured_output(body, params);
  try {
    sampling::validate(p, std::numeric_limits<int32_t>::max());
  } catch (const std::exception& error) {
    throw ApiError(400, error.what());
  }
  return params;
}

namespace {

// Text content as the template expects it: a string, or text parts joined by newlines.
std::string message_text(const Json& content, size_t index) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return "";
  if (!content.is_array())
    throw ApiError(400, fmt::format("messages[{}].content must be a string or an array", index),
                   "messages");
  std::string text;
  for (const Json& part : content) {
    if (!part.is_object() || part.find("type") == part.end() || part["type"] != "text" ||
        !part.contains("text") || !part["text"].is_string()) {
      throw ApiError(400, fmt::format("messages[{}].content: only text parts are supported", index),
                     "messages");
    }
    if (!text.empty()) text += "\n";
    text += part["text"].get<std::string>();
  }
  return text;
}

// An assistant's earlier tool calls and a tool message's call id, checked for the types the
// chat templates and the DeepSeek encoding read: the request, not a template, names the
// mistake.
void check_tool_fields(const Json& message, size_t index) {
  std::string where = fmt::format("messages[{}]", index);
  (void)string_field(message, "tool_call_id", where);
  auto calls = message.find("tool_calls");
  if (calls == message.end() || calls->is_null()) return;
  if (!calls->is_array())
    throw ApiError(400, fmt::format("{}.tool_calls must be an array", where), "messages");
  for (size_t c = 0; c < calls->size(); ++c) {
    const Json& call = (*calls)[c];
    std::string call_where = fmt::format("{}.tool_calls[{}]", where, c);
    auto function = call.is_object() ? call.find("function") : call.end();
    if (!call.is_object() || function == call.end() || !function->is_object())
      throw ApiError(400, fmt::format("{} needs a 'function' object", call_where), "messages");
    (void)string_field(call, "id", call_where);
    (void)string_field(call, "type", call_where);
    if (!function->contains("name") || !(*function)["name"].is_string())
      throw ApiError(400, fmt::format("{}.function needs a string 'name'", call_where), "messages");
    auto arguments = function->find("arguments");
    if (arguments != function->end() && !arguments->is_string() && !arguments->is_object() &&
        !arguments->is_null())
      throw ApiError(400,
                     fmt::format("{}.function.arguments must be a string or an object", call_where),
                     "messages");
  }
}

Json normalize_messages(const Json& messages) {
  if (!messages.is_array() || messages.empty())
    throw ApiError(400, "'messages' must be a non-empty array", "messages");
  Json out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& message = messages[i];
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string())
      throw ApiError(400, fmt::format("messages[{}] needs a string 'role'", i), "messages");
    std::string role = message["role"].get<std::string>();
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" &&
        role != "tool") {
      throw ApiError(400, fmt::format("messages[{}].role '{}' is not a known role", i, role),
                     "messages");
    }
    check_tool_fields(message, i);
    (void)string_field(message, "name", fmt::format("messages[{}]", i));
    Json copy = message;
    if (role == "developer") copy["role"] = "system";  // what chat templates know
    copy["content"] = message_text(message.value("content", Json(nullptr)), i);
    out.push_back(std::move(copy));
  }
  return out;
}

// Chat tools as the API defines them: {"type": "function", "function": {"name": string,
// "description"?: string, "parameters"?: object}}; templates read these fields.
void check_chat_tools(const Json& tools) {
  check_tools(tools);
  for (size_t t = 0; t < tools.size(); ++t) {
    const Json& tool = tools[t];
    std::string where = fmt::format("tools[{}]", t);
    if (!tool.is_object() || string_field(tool, "type", where) != "function" ||
        !tool.contains("function") || !tool["function"].is_object())
      throw ApiError(
          400, fmt::format("{} must be {{\"type\": \"function\", \"function\": {{...}}}}", where),
          "tools");
    const Json& function = tool["function"];
    if (!function.contains("name") || !function["name"].is_string())
      throw ApiError(400, fmt::format("{}.function needs a string 'name'", where), "tools");
    (void)string_field(function, "description", where + ".function");
    if (auto parameters = function.find("parameters");
        parameters != function.end() && !parameters->is_null() && !parameters->is_object())
      throw ApiError(400, fmt::format("{}.function.parameters must be an object", where), "tools");
  }
}

}  // namespace

ChatCompletionRequest parse_chat_completion(const std::string& body_text) {
  Json body = parse_json_object(body_text);
  ChatCompletionRequest request;
  read(body, "model", request.model);
  if (!body.contains("messages")) throw ApiError(400, "'messages' is required", "messages");
  request.chat.messages = normalize_messages(body["messages"]);
  request.chat.add_generation_prompt = true;
  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    check_chat_tools(*tools);
    request.chat.tools = *tools;
  }
  if (auto choice = body.find("tool_choice"); choice != body.end())
    request.chat.tool_choice = parse_tool_choice(*choice, request.chat.tools);
  if (request.chat.tool_choice.mode == chat::ToolChoice::Mode::kNone) request.chat.tools = nullptr;
  Json& variables = request.chat.variables;
  if (auto effort = body.find("reasoning_effort"); effort != body.end() && !effort->is_null()) {
    if (!effort->is_string() && !effort->is_number_integer())
      throw ApiError(400, "'reasoning_effort' must be a string", "reasoning_effort");
    variables["reasoning_effort"] = *effort;
  }
  // DeepSeek's API switches thinking with {"thinking": {"type": "enabled" | "disabled"}}.
  if (auto thinking = body.find("thinking"); thinking != body.end() && thinking->is_object()) {
    bool enabled = string_field(*thinking, "type", "thinking") == "enabled";
    variables["thinking"] = enabled;
    variables["enable_thinking"] = enabled;
  }
  (void)bool_field(body, "parallel_tool_calls", true);
  if (auto kwargs = body.find("chat_template_kwargs"); kwargs != body.end() && !kwargs->is_null()) {
    if (!kwargs->is_object())
      throw ApiError(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs");
    for (const auto& [key, value] : kwargs->items()) variables[key] = value;
  }
  request.params = parse_generation_params(body, true);
  return request;
}

CompletionRequest parse_completion(const std::string& body_text) {
  Json body = parse_json_object(body_text);
  CompletionRequest request;
  read(body, "model", request.model);
  auto prompt = body.find("prompt");
  if (prompt == body.end()) throw ApiError(400, "'prompt' is required", "prompt");
  if (prompt->is_string()) {
    request.prompt_text = prompt->get<std::string>();
  } else if (prompt->is_array() && !prompt->empty() &&
             std::all_of(prompt->begin(), prompt->end(),
                         [](const Json& id) { return id.is_number_integer(); })) {
    request.prompt_ids = read_token_ids(*prompt, "prompt");
  } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    request.prompt_text = (*prompt)[0].get<std::string>();
  } else {
    throw ApiError(400,
                   "'prompt' must be a string or an array of token ids (one prompt per request)",
                   "prompt");
  }
  read(body, "echo", request.echo);
  // Fields this server does not implement are refused rather than silently ignored.
  if (auto suffix = body.find("suffix"); suffix != body.end() && !suffix->is_null())
    throw ApiError(400, "'suffix' is not supported", "suffix");
  request.params = parse_generation_params(body, false);
  if (auto best_of = body.find("best_of"); best_of != body.end() && !best_of->is_null()) {
    int64_t value = checked_integer(*best_of, "best_of", 1, RequestLimits::kCompletions);
    if (value != request.params.sampling.n)
      throw ApiError(400, "'best_of' other than n is not supported", "best_of");
  }
  return request;
}

Json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

namespace {

Json finish_json(const std::string& reason) {
  return reason.empty() ? Json(nullptr) : Json(reason);
}

Json stop_reason_json(const ChoiceOutput& choice) {
  return choice.stop_reason.empty() ? Json(nullptr) : Json(choice.stop_reason);
}

// The fields every OpenAI response object and stream chunk starts with.
Json envelope(const std::string& id, const char* object, int64_t created, const std::string& model,
              Json choices) {
  return {{"id", id},
          {"object", object},
          {"created", created},
          {"model", model},
          {"choices", std::move(choices)}};
}

}  // namespace

Json tool_calls_json(const std::vector<ToolCall>& calls) {
  Json list = Json::array();
  for (const ToolCall& call : calls) {
    list.push_back({{"id", call.id},
                    {"type", "function"},
                    {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  }
  return list;
}

Json chat_completion_json(const std::string& id, int64_t created, const std::string& model,
                          const std::vector<ChoiceOutput>& choices, const Usage& usage) {
  Json list = Json::array();
  for (const ChoiceOutput& choice : choices) {
    Json message = {{"role", "assistant"}, {"content", choice.text}};
    if (!choice.reasoning.empty()) message["reasoning_content"] = choice.reasoning;
    if (!choice.tool_calls.empty()) {
      if (choice.text.empty()) message["content"] = nullptr;
      message["tool_calls"] = tool_calls_json(choice.tool_calls);
    }
    list.push_back({{"index", choice.index},
                    {"message", message},
                    {"logprobs", choice.logprobs},
                    {"finish_reason", finish_json(choice.finish_reason)},
                    {"stop_reason", stop_reason_json(choice)}});
  }
  Json body = envelope(id, "chat.completion", created, model, std::move(list));
  body["usage"] = usage_json(usage);
  body["system_fingerprint"] = nullptr;
  return body;
}

Json chat_chunk_json(const std::string& id, int64_t created, const std::string& model, int index,
                     const Json& delta, const std::string& finish_reason, const Json& logprobs) {
  Json choice = {{"index", index},
                 {"delta", delta},
                 {"logprobs", logprobs},
                 {"finish_reason", finish_json(finish_reason)}};
  return envelope(id, "chat.completion.chunk", created, model, Json::array({choice}));
}

Json completion_json(const std::string& id, int64_t created, const std::string& model,
                     const std::vector<ChoiceOutput>& choices, const Usage& usage) {
  Json list = Json::array();
  for (const ChoiceOutput& choice : choices) {
    list.push_back({{"index", choice.index},
                    {"text", choice.text},
                    {"logprobs", choice.logprobs},
                    {"finish_reason", finish_json(choice.finish_reason)},
                    {"stop_reason", stop_reason_json(choice)}});
  }
  Json body = envelope(id, "text_completion", created, model, std::move(list));
  body["usage"] = usage_json(usage);
  return body;
}

Json completion_chunk_json(const std::string& id, int64_t created, const std::string& model,
                           int index, const std::string& text, const std::string& finish_reason) {
  Json choice = {{"index", index},
                 {"text", text},
                 {"logprobs", nullptr},
                 {"finish_reason", finish_json(finish_reason)}};
  return envelope(id, "text_completion", created, model, Json::array({choice}));
}

Json usage_chunk_json(const std::string& id, const std::string& object, int64_t created,
                      const std::string& model, const Usage& usage) {
  Json body = envelope(id, object.c_str(), created, model, Json::array());
  body["usage"] = usage_json(usage);
  return body;
}

Json chat_logprobs_json(const std::vector<sampling::Sample>& samples,
                        const std::function<std::string(int32_t)>& token_text) {
  auto entry = [&](int32_t token, float logprob) {
    std::string text = token_text(token);
    std::vector<int> bytes(text.begin(), text.end());
    for (int& byte : bytes) byte &= 0xff;
    return Json{{"token", text}, {"logprob", logprob}, {"bytes", bytes}};
  };
  Json content = Json::array();
  for (const sampling::Sample& sample : samples) {
    Json item = entry(sample.token, sample.logprob);
    Json top = Json::array();
    for (const sampling::Logprob& alternative : sample.top)
      top.push_back(entry(alternative.token, alternative.logprob));
    item["top_logprobs"] = top;
    content.push_back(std::move(item));
  }
  return {{"content", content}};
}

std::string sse_event(const Json& payload) {
  return "data: " + json_text(payload) + "\n\n";
}

}  // namespace deepinfer::protocol

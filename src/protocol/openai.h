// The OpenAI API shapes: requests of /v1/chat/completions and /v1/completions parsed and
// checked into typed parameters, and responses, stream chunks and errors formatted the way
// the official clients parse them.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "chat/model_template.h"
#include "engine/request.h"
#include "protocol/output_parser.h"

namespace deepinfer::protocol {

using Json = nlohmann::ordered_json;

// A request the client must fix: HTTP status plus the fields of the error body.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = "", std::string type = "");
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& type() const { return type_; }

 private:
  int status_;
  std::string param_;
  std::string type_;
};

// {"error": {"message", "type", "param", "code"}}
Json openai_error_body(const ApiError& error);

// The body as a JSON object; malformed JSON, nesting deeper than kMaxJsonDepth or another
// type is a 400.
Json parse_json_object(const std::string& body);
// "an integer", "a string", ...: a value's type as error messages name it.
const char* json_type_name(const Json& value);
// An integer field in [lowest, highest]; any other type or value is a 400 naming `field`
// (never a silent wrap to a narrower type).
int64_t checked_integer(const Json& value, const std::string& field, int64_t lowest,
                        int64_t highest);
// The string member `key` of `object` (`fallback` when absent or null). Any other type is a
// 400 naming "<where>.<key>" (just "<key>" when `where` is empty); `object` must be a JSON
// object.
std::string string_field(const Json& object, const char* key, const std::string& where,
                         const std::string& fallback = "");
// The boolean member `key` of `object` (`fallback` when absent or null); any other type is a
// 400 naming it.
bool bool_field(const Json& object, const char* key, bool fallback);
// structured_outputs and guided_* into params.structured; 400 for a kind not supported.
struct GenerationParams;
void read_structured_output(const Json& body, GenerationParams& params);
// A tools array within RequestLimits, else a 400.
void check_tools(const Json& tools);
// An array of token ids (each in [0, 2^31)), else a 400 naming `field`.
std::vector<int32_t> read_token_ids(const Json& value, const std::string& field);

// A constraint on the output beyond json_object (vLLM's structured_outputs and guided_*
// fields): at most one of them is set.
struct StructuredOutput {
  std::string regex;                // the whole output matches it
  std::vector<std::string> choice;  // the whole output is one of them
  std::string json_schema;          // the output is one JSON value this schema accepts (its text)
  std::string grammar;              // the output is a sentence of this GBNF or Lark grammar
  std::string field;                // the request field that set it, for errors
  bool any() const {
    return !regex.empty() || !choice.empty() || !json_schema.empty() || !grammar.empty();
  }
};

// A JSON Schema given inline (an object or a boolean) or as its JSON text (vLLM's guided_json
// takes both), as compact text; ApiError 400 naming `field` otherwise.
std::string read_schema(const Json& value, const std::string& field, const std::string& param);

// What chat and text completions share.
struct GenerationParams {
  sampling::SamplingParams sampling;
  std::optional<int> max_tokens;  // none: up to the context length
  int min_tokens = 0;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int priority = 0;
  bool json_output = false;  // response_format json_object
  StructuredOutput structured;
  // Requests share cached prefixes only with the same salt (vLLM's cache_salt).
  std::string cache_salt;
  // The retention class of the request's cached blocks on disk (empty: the server's default).
  std::string cache_retention;
};

struct ChatCompletionRequest {
  std::string model;
  chat::ChatRequest chat;
  GenerationParams params;
};

struct CompletionRequest {
  std::string model;
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;  // when the prompt came as token ids
  bool echo = false;
  GenerationParams params;
};

// The sampling and length fields shared by every API (OpenAI names; `chat` picks the chat
// form of logprobs); ApiError (400) names the offending field.
GenerationParams parse_generation_params(const Json& body, bool chat);

// tool_choice in the Chat form ("none", "auto", "required", {"type": "function",
// "function": {"name"}}) or the Responses form ({"type": "function", "name"}), checked
// against the request's tools (OpenAI-shaped).
chat::ToolChoice parse_tool_choice(const Json& choice, const Json& tools);
// ApiError 400 when a required or named choice has no tool to call.
void check_tool_choice(const chat::ToolChoice& choice, const Json& tools);

// Parse and check a request body; ApiError (400) names the offending field.
ChatCompletionRequest parse_chat_completion(const std::string& body);
CompletionRequest parse_completion(const std::string& body);

// One completion's final state for a response.
struct ChoiceOutput {
  int index = 0;
  std::string text;
  std::string reasoning;             // parsed out of the text, where the model marks it
  std::vector<ToolCall> tool_calls;  // likewise
  std::string finish_reason;         // "stop", "length"
  std::string stop_reason;           // the matched stop string, if any
  Json logprobs;                     // null, or the API's logprobs object
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
};
Json usage_json(const Usage& usage);

// Chat tool_calls entries (arguments as a JSON string).
Json tool_calls_json(const std::vector<ToolCall>& calls);

Json chat_completion_json(const std::string& id, int64_t created, const std::string& model,
                          const std::vector<ChoiceOutput>& choices, const Usage& usage);
Json chat_chunk_json(const std::string& id, int64_t created, const std::string& model, int index,
                     const Json& delta, const std::string& finish_reason, const Json& logprobs);
Json completion_json(const std::string& id, int64_t created, const std::string& model,
                     const std::vector<ChoiceOutput>& choices, const Usage& usage);
Json completion_chunk_json(const std::string& id, int64_t created, const std::string& model,
                           int index, const std::string& text, const std::string& finish_reason);
// The last stream chunk with usage and no choices (stream_options.include_usage).
Json usage_chunk_json(const std::string& id, const std::string& object, int64_t created,
                      const std::string& model, const Usage& usage);

// Chat logprobs entries ({"token", "logprob", "bytes", "top_logprobs"}) for sampled tokens;
// `token_text` gives each id's text.
Json chat_logprobs_json(const std::vector<sampling::Sample>& samples,
                        const std::function<std::string(int32_t)>& token_text);

// "data: {json}\n\n"
std::string sse_event(const Json& payload);

}  // namespace deepinfer::protocol

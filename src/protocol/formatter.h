// How one API frames a generation: the whole answer, or its stream events piece by piece.
// The server feeds every format the same things (text pieces per completion, completion
// ends, usage); each format owns its shapes.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "protocol/openai.h"

namespace deepinfer::protocol {

struct ResponseMeta {
  std::string id;
  std::string model;
  int64_t created = 0;
  int64_t prompt_tokens = 0;
  bool include_usage = false;  // OpenAI stream_options.include_usage
};

class ResponseFormatter {
 public:
  virtual ~ResponseFormatter() = default;
  // Stream text sent before any token ("" when the format has none).
  virtual std::string stream_start() { return ""; }
  virtual std::string stream_text(int index, const std::string& piece) = 0;
  // A parsed piece (reasoning, content, finished tool calls); formats that do not map
  // reasoning and tool calls yet stream the content only.
  virtual std::string stream_parsed(int index, const ParsedOutput& delta) {
    return delta.content.empty() ? "" : stream_text(index, delta.content);
  }
  virtual std::string stream_finish(const ChoiceOutput& choice, const std::string& tail) = 0;
  virtual std::string stream_end(const Usage& usage) = 0;
  virtual Json whole(const std::vector<ChoiceOutput>& choices, const Usage& usage) = 0;
  // The error body this API's clients parse.
  virtual Json error_body(const ApiError& error) const { return openai_error_body(error); }
  // The events that end a stream that failed after it started: the error as this API's
  // clients read it mid-stream, then the stream's terminator (OpenAI: data: [DONE]).
  virtual std::string stream_error(const ApiError& error) {
    return sse_event(error_body(error)) + "data: [DONE]\n\n";
  }
};

enum class ApiFormat { kChatCompletions, kCompletions, kAnthropicMessages, kResponses };

std::unique_ptr<ResponseFormatter> make_formatter(ApiFormat format, ResponseMeta meta);

// The API a route speaks; nullopt for routes that are none of the four.
std::optional<ApiFormat> api_format_for(const std::string& path);
// The error body a route's clients parse: Anthropic's on /v1/messages, OpenAI's elsewhere.
using ErrorBody = Json (*)(const ApiError&);
ErrorBody error_body_for(const std::string& path);

}  // namespace deepinfer::protocol

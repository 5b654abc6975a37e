// The Anthropic Messages API (/v1/messages): requests converted to the chat messages a
// template renders, and answers in Anthropic's shapes (content blocks, named stream events,
// error bodies).
#pragma once

#include <memory>
#include <string>

#include "protocol/formatter.h"
#include "protocol/openai.h"

namespace deepinfer::protocol {

struct MessagesRequest {
  std::string model;
  chat::ChatRequest chat;  // system + messages as chat-template messages, tools
  GenerationParams params;
};

// Parse and check a /v1/messages body; ApiError (400) names the offending field.
MessagesRequest parse_messages(const std::string& body);

// {"type": "error", "error": {"type", "message"}}
Json anthropic_error_body(const ApiError& error);

std::unique_ptr<ResponseFormatter> make_anthropic_formatter(ResponseMeta meta);

}  // namespace deepinfer::protocol

// The OpenAI Responses API (/v1/responses): input items converted to chat-template messages,
// and answers as a response object with output items, or its typed stream events ending with
// response.completed.
#pragma once

#include <memory>
#include <string>

#include "protocol/formatter.h"
#include "protocol/openai.h"

namespace deepinfer::protocol {

struct ResponsesRequest {
  std::string model;
  chat::ChatRequest chat;
  GenerationParams params;
};

// Parse and check a /v1/responses body; ApiError (400) names the offending field.
ResponsesRequest parse_responses(const std::string& body);

std::unique_ptr<ResponseFormatter> make_responses_formatter(ResponseMeta meta);

}  // namespace deepinfer::protocol

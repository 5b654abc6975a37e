// What one request may hold, in one place: each limit is checked where the request is parsed
// (a 4xx naming the field and the limit), and `deepinfer serve --help` lists them.
#pragma once

#include <cstddef>
#include <string>

#include "core/json.h"
#include "sampling/sampling.h"

namespace deepinfer::protocol {

struct RequestLimits {
  static constexpr int kJsonDepth = kMaxJsonDepth;  // arrays and objects inside each other
  static constexpr size_t kStopStrings = 16;        // entries of "stop" / "stop_sequences"
  static constexpr size_t kStopStringBytes = 1024;  // each stop string
  static constexpr size_t kStopTokenIds = 1024;     // entries of "stop_token_ids"
  static constexpr size_t kLogitBias = 1024;        // entries of "logit_bias"
  static constexpr size_t kTools = 256;             // tools one request offers
  static constexpr size_t kToolsBytes = 1 << 20;    // the tools' JSON, all of them
  static constexpr size_t kChoices = 4096;          // entries of a choice constraint
  static constexpr int kCompletions = sampling::kMaxCompletions;  // "n"
  static constexpr int kTopLogprobs = sampling::kMaxTopLogprobs;  // "top_logprobs", "logprobs"
};

// The limits above plus the server's own (body size, prompt tokens), for --help.
std::string request_limits_text(size_t max_body_bytes);

}  // namespace deepinfer::protocol

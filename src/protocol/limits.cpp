#include "protocol/limits.h"

#include <fmt/format.h>

#include "structured/regex.h"

namespace deepinfer::protocol {

std::string request_limits_text(size_t max_body_bytes) {
  using L = RequestLimits;
  return fmt::format(
      "Request limits (each exceeded limit is a 4xx naming it):\n"
      "  body {} bytes (--max-request-bytes; 413), headers 64 KiB (431)\n"
      "  JSON nesting {} levels; n {}; top_logprobs {}\n"
      "  stop strings {} of at most {} bytes; stop_token_ids {}; logit_bias entries {}\n"
      "  tools {}, {} bytes of JSON in all\n"
      "  structured output: a regex of at most {} bytes, repeat counts up to {}, {} automaton\n"
      "  states; choice lists of {} entries\n"
      "  prompt + max_tokens within --max-model-len tokens; a prompt's text is refused before\n"
      "  tokenizing when it is longer than the context could hold\n",
      max_body_bytes, L::kJsonDepth, L::kCompletions, L::kTopLogprobs, L::kStopStrings,
      L::kStopStringBytes, L::kStopTokenIds, L::kLogitBias, L::kTools, L::kToolsBytes,
      structured::RegexTree::kMaxPatternBytes, structured::RegexTree::kMaxRepeat,
      structured::ByteDfa::kMaxStates, L::kChoices);
}

}  // namespace deepinfer::protocol

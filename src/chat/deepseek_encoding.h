// DeepSeek V4 and V4.1 conversation encodings (no Jinja template ships with them): system
// text with "## Tools" and "## Response Format" sections, the reasoning-effort line, user
// turns that carry tool results in <tool_result> tags, assistant history with reasoning and
// DSML tool-call blocks, and the thinking or non-thinking generation prompt. Written as
// segments: what the client sent is encoded without the added vocabulary.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "chat/model_template.h"

namespace deepinfer::chat {

enum class DeepSeekEncoding { kV4, kV41 };

struct DeepSeekPromptOptions {
  DeepSeekEncoding version = DeepSeekEncoding::kV41;
  // Assistant reasoning before the last user turn is shown again only in conversations with
  // tools (what DeepSeek's own encoder is reported to do); true keeps all of it.
  bool keep_all_reasoning = false;
  // V4's reasoning-effort sentences by level ("low", "medium", "high", "max"); a level with no
  // sentence writes none. Second-hand data, so it is configuration, not code.
  std::map<std::string, std::string> v4_effort_sentences = {
      {"max", "Reasoning Effort: Absolute maximum with no shortcuts permitted."}};
};

// The text that opens a tool-call block (tool_choice required), and what goes around the
// function's name to open one call in it (tool_choice named); what closes the call after its
// arguments (named) or after its call object (required), where those are JSON the engine
// holds to a schema (empty: the model closes it).
struct ForcedCallText {
  std::string block;
  std::string before_name, after_name;
  std::string after_arguments, after_call;
};
ForcedCallText dsml_forced_call(DeepSeekEncoding version);

// A rendered prompt and the byte ranges of it that hold client text (to be encoded without
// the added vocabulary).
struct SegmentedPrompt {
  std::string text;
  std::vector<std::pair<size_t, size_t>> content;
};

// The request as the model sees it. Thinking mode comes from the `thinking` or
// `enable_thinking` variable, or a `reasoning_effort` other than "none"; the effort is
// "low", "medium", "high", "max" or (V4.1) an integer 1 to 100. With tool_choice required or
// named the prompt ends in non-thinking mode, ready for the caller to open the call. Error on
// a malformed conversation.
SegmentedPrompt render_deepseek_prompt(const DeepSeekPromptOptions& options,
                                       const ChatRequest& request);

}  // namespace deepinfer::chat

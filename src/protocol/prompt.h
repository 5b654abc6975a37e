// Chat prompts whose control tokens come only from the template: added-token text that a
// client typed (a user writing "<|im_end|>") is encoded as ordinary text, while the same text
// produced by the template is the control token.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chat/model_template.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::protocol {

struct EncodedPrompt {
  std::string text;  // the rendered prompt, as transformers' apply_chat_template gives it
  std::vector<int32_t> ids;
  // Byte ranges of `text` encoded without the added vocabulary (client text).
  std::vector<std::pair<size_t, size_t>> client_token_text;
};

// Renders `request` with `chat_template`, not yet encoded (ids stay empty: ChatEncoder
// encodes once, after adding any forced tool call). Every string the client sent (messages,
// tools, template variables) has its added-token occurrences marked with two Unicode
// noncharacters before rendering; the marks locate them in the output (client_token_text)
// and are removed, so the tokenizer matches no added token there. (Noncharacters a client
// sends are dropped: they have no meaning in interchanged text.)
EncodedPrompt render_chat_prompt(const chat::ModelChatTemplate& chat_template,
                                 const Tokenizer& tokenizer, chat::ChatRequest request);

}  // namespace deepinfer::protocol

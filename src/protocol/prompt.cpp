#include "protocol/prompt.h"

#include <algorithm>
#include <map>

namespace deepinfer::protocol {
namespace {

constexpr std::string_view kOpen = "\xEF\xB7\x90";   // U+FDD0
constexpr std::string_view kClose = "\xEF\xB7\x91";  // U+FDD1

// Added-token contents by first byte, longest first, for a quick scan of client text.
class TokenTexts {
 public:
  explicit TokenTexts(const Tokenizer& tokenizer) {
    for (std::string& content : tokenizer.added_token_contents())
      if (!content.empty()) by_first_[static_cast<unsigned char>(content[0])].push_back(content);
    for (auto& [first, contents] : by_first_) {
      std::sort(contents.begin(), contents.end(),
                [](const auto& a, const auto& b) { return a.size() > b.size(); });
    }
  }
  // `text` with noncharacters removed and every added-token occurrence wrapped in marks.
  std::string mark(const std::string& text, int& marked) const {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      std::string_view rest(text.data() + i, text.size() - i);
      if (rest.substr(0, 3) == kOpen || rest.substr(0, 3) == kClose) {
        i += 3;
        continue;
      }
      const std::string* found = nullptr;
      auto candidates = by_first_.find(static_cast<unsigned char>(text[i]));
      if (candidates != by_first_.end()) {
        for (const std::string& content : candidates->second) {
          if (rest.substr(0, content.size()) == content) {
            found = &content;
            break;
          }
        }
      }
      if (!found) {
        out += text[i++];
        continue;
      }
      out.append(kOpen).append(*found).append(kClose);
      i += found->size();
      ++marked;
    }
    return out;
  }

 private:
  std::map<unsigned char, std::vector<std::string>> by_first_;
};

// Every client string, object keys included (a template's tojson prints keys too, so a
// tool parameter named "<|im_end|>" must not become that token). Requests nest at most
// kMaxJsonDepth levels, so the recursion is bounded.
void mark_strings(nlohmann::ordered_json& value, const TokenTexts& texts, int& marked) {
  if (value.is_string()) {
    value = texts.mark(value.get<std::string>(), marked);
  } else if (value.is_array()) {
    for (auto& child : value) mark_strings(child, texts, marked);
  } else if (value.is_object()) {
    nlohmann::ordered_json object = nlohmann::ordered_json::object();
    for (auto& [key, child] : value.items()) {
      mark_strings(child, texts, marked);
      object[texts.mark(key, marked)] = std::move(child);
    }
    value = std::move(object);
  }
}

}  // namespace

EncodedPrompt render_chat_prompt(const chat::ModelChatTemplate& chat_template,
                                 const Tokenizer& tokenizer, chat::ChatRequest request) {
  TokenTexts texts(tokenizer);
  int marked = 0;
  mark_strings(request.messages, texts, marked);
  mark_strings(request.tools, texts, marked);
  mark_strings(request.variables, texts, marked);
  std::string rendered = chat_template.render(request);
  EncodedPrompt prompt;
  if (marked == 0) {
    prompt.text = std::move(rendered);
    return prompt;
  }
  // Strip the marks; a pair that survived rendering intact locates client-typed token text
  // (a template may have cut one apart, e.g. splitting on a token: then nothing is kept).
  size_t open = std::string::npos;
  for (size_t i = 0; i < rendered.size();) {
    std::string_view rest(rendered.data() + i, rendered.size() - i);
    if (rest.substr(0, 3) == kOpen) {
      open = prompt.text.size();
      i += 3;
    } else if (rest.substr(0, 3) == kClose) {
      if (open != std::string::npos)
        prompt.client_token_text.emplace_back(open, prompt.text.size());
      open = std::string::npos;
      i += 3;
    } else {
      prompt.text += rendered[i++];
    }
  }
  return prompt;
}

}  // namespace deepinfer::protocol

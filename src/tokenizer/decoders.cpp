// Decoders of tokenizer.json: token strings back to text.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/components.h"
#include "tokenizer/text.h"

namespace deepinfer::tokenization {
namespace {

// Printable characters back to the bytes they stand for; a token with any other character
// (an added token such as "<|im_end|>") keeps its own bytes.
class ByteLevelDecoder final : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens) const override {
    decode_bytes(tokens);
    tokens = {text::utf8_lossy(tokens[0])};
  }
  void decode_bytes(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) {
      std::string mapped;
      bool all_mapped = true;
      for (size_t i = 0; i < token.size() && all_mapped;) {
        int byte = char_to_byte(text::code_point_at(token, i));
        if (byte < 0) all_mapped = false;
        mapped += static_cast<char>(byte);
        i += static_cast<size_t>(text::utf8_length(static_cast<unsigned char>(token[i])));
      }
      bytes += all_mapped ? mapped : token;
    }
    tokens = {bytes};
  }
};

// "<0xAB>" tokens become bytes; a run that is not valid UTF-8 becomes one U+FFFD per byte.
class ByteFallback final : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens) const override { run(tokens, false); }
  void decode_bytes(std::vector<std::string>& tokens) const override { run(tokens, true); }

 private:
  static void run(std::vector<std::string>& tokens, bool raw) {
    std::vector<std::string> out;
    std::string pending;
    size_t pending_count = 0;
    auto flush = [&] {
      if (pending_count == 0) return;
      if (raw || text::is_valid_utf8(pending)) {
        out.push_back(pending);
      } else {
        std::string replacement;
        for (size_t i = 0; i < pending_count; ++i) replacement += "\xef\xbf\xbd";
        out.push_back(replacement);
      }
      pending.clear();
      pending_count = 0;
    };
    for (std::string& token : tokens) {
      int byte = byte_token(token);
      if (byte >= 0) {
        pending += static_cast<char>(byte);
        ++pending_count;
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    tokens = std::move(out);
  }

  static int byte_token(const std::string& token) {
    if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
    int value = 0;
    for (int i = 3; i < 5; ++i) {
      char ch = token[static_cast<size_t>(i)];
      int digit = ch >= '0' && ch <= '9'   ? ch - '0'
                  : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                  : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                                           : -1;
      if (digit < 0) return -1;
      value = value * 16 + digit;
    }
    return value;
  }
};

class Fuse final : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const std::string& token : tokens) joined += token;
    tokens = {joined};
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  explicit ReplaceDecoder(const Json& description) {
    const Json& pattern = description.at("pattern");
    if (!pattern.contains("String"))
      fail("tokenizer.json: Replace decoder supports String patterns only");
    from_ = pattern["String"].get<std::string>();
    to_ = description.at("content").get<std::string>();
    if (from_.empty()) fail("tokenizer.json: Replace decoder with an empty pattern");
  }
  void decode(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      std::string out;
      size_t last = 0;
      for (size_t at = token.find(from_); at != std::string::npos; at = token.find(from_, last)) {
        out.append(token, last, at - last);
        out += to_;
        last = at + from_.size();
      }
      out.append(token, last, std::string::npos);
      token = std::move(out);
    }
  }

 private:
  std::string from_, to_;
};

class StripDecoder final : public Decoder {
 public:
  explicit StripDecoder(const Json& description)
      : content_(description.at("content").get<std::string>()),
        start_(description.value("start", 0)),
        stop_(description.value("stop", 0)) {}
  void decode(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      for (int i = 0; i < start_ && token.rfind(content_, 0) == 0; ++i)
        token.erase(0, content_.size());
      for (int i = 0; i < stop_ && token.size() >= content_.size() &&
                      token.compare(token.size() - content_.size(), content_.size(), content_) == 0;
           ++i) {
        token.erase(token.size() - content_.size());
      }
    }
  }

 private:
  std::string content_;
  int start_, stop_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  explicit MetaspaceDecoder(const Json& description)
      : replacement_(description.value("replacement", std::string("\xe2\x96\x81"))),
        prepend_(description.value("prepend_scheme", std::string("always")) != "never") {}
  // As transformers: every marker becomes a space, except in the first token, where (unless
  // the scheme is "never") markers are dropped, not only a leading one.
  void decode(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& token = tokens[i];
      for (size_t at = 0; at < token.size();) {
        if (token.compare(at, replacement_.size(), replacement_) == 0) {
          if (!(i == 0 && prepend_)) out += ' ';
          at += replacement_.size();
        } else {
          out += token[at++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool prepend_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> stages)
      : stages_(std::move(stages)) {}
  void decode(std::vector<std::string>& tokens) const override {
    for (const auto& stage : stages_) stage->decode(tokens);
  }
  void decode_bytes(std::vector<std::string>& tokens) const override {
    for (const auto& stage : stages_) stage->decode_bytes(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> stages_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const Json& description) {
  if (description.is_null()) return nullptr;
  if (!description.is_object() || !description.contains("type"))
    fail("tokenizer.json: decoder has no \"type\"");
  std::string type = description["type"].get<std::string>();
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(description);
  if (type == "Strip") return std::make_unique<StripDecoder>(description);
  if (type == "Metaspace") return std::make_unique<MetaspaceDecoder>(description);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> stages;
    for (const Json& stage : description.at("decoders")) {
      if (auto made = make_decoder(stage)) stages.push_back(std::move(made));
    }
    return std::make_unique<SequenceDecoder>(std::move(stages));
  }
  fail(
      "tokenizer.json: decoder type \"{}\" is not supported (supported: ByteLevel, ByteFallback, "
      "Fuse, Replace, Strip, Metaspace, Sequence)",
      type);
}

}  // namespace deepinfer::tokenization

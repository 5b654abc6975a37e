// Normalizers and post-processors of tokenizer.json.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/components.h"
#include "tokenizer/text.h"

namespace deepinfer::tokenization {
namespace {

std::string type_of(const Json& description, const char* stage) {
  if (!description.is_object() || !description.contains("type") ||
      !description["type"].is_string()) {
    fail("tokenizer.json: {} has no \"type\"", stage);
  }
  return description["type"].get<std::string>();
}

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(text::NormalForm form) : form_(form) {}
  std::string apply(std::string value) const override { return text::normalize(value, form_); }

 private:
  text::NormalForm form_;
};

class Lowercase final : public Normalizer {
 public:
  std::string apply(std::string value) const override { return text::lowercase(value); }
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  std::string apply(std::string value) const override {
    size_t begin = 0, end = value.size();
    while (left_ && begin < end && text::is_whitespace(text::code_point_at(value, begin)))
      begin += static_cast<size_t>(text::utf8_length(static_cast<unsigned char>(value[begin])));
    while (right_ && end > begin) {
      size_t last = end - 1;
      while (last > begin && (static_cast<unsigned char>(value[last]) & 0xc0) == 0x80) --last;
      if (!text::is_whitespace(text::code_point_at(value, last))) break;
      end = last;
    }
    return value.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string apply(std::string value) const override {
    return value.empty() ? value : prefix_ + value;
  }

 private:
  std::string prefix_;
};

// Replace with a literal string or a regex pattern.
class Replace final : public Normalizer {
 public:
  explicit Replace(const Json& description) {
    const Json& pattern = description.at("pattern");
    content_ = description.at("content").get<std::string>();
    if (pattern.contains("String")) {
      literal_ = pattern["String"].get<std::string>();
      if (literal_.empty()) fail("tokenizer.json: Replace with an empty pattern");
    } else if (pattern.contains("Regex")) {
      regex_ = std::make_unique<text::Regex>(pattern["Regex"].get<std::string>());
    } else {
      fail("tokenizer.json: Replace pattern must be String or Regex");
    }
  }
  std::string apply(std::string value) const override {
    std::string out;
    size_t last = 0;
    auto emit = [&](size_t begin, size_t end) {
      out.append(value, last, begin - last);
      out += content_;
      last = end;
    };
    if (regex_) {
      for (auto [begin, end] : regex_->find_all(value)) emit(begin, end);
    } else {
      for (size_t at = value.find(literal_); at != std::string::npos;
           at = value.find(literal_, last)) {
        emit(at, at + literal_.size());
      }
    }
    out.append(value, last, std::string::npos);
    return out;
  }

 private:
  std::string literal_, content_;
  std::unique_ptr<text::Regex> regex_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> stages) : stages_(std::move(stages)) {}
  std::string apply(std::string value) const override {
    for (const auto& stage : stages_) value = stage->apply(std::move(value));
    return value;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> stages_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const Json& description) {
  if (description.is_null()) return nullptr;
  std::string type = type_of(description, "normalizer");
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(text::NormalForm::kNfc);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(text::NormalForm::kNfd);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(text::NormalForm::kNfkc);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(text::NormalForm::kNfkd);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Strip") {
    return std::make_unique<Strip>(description.value("strip_left", true),
                                   description.value("strip_right", true));
  }
  if (type == "Prepend")
    return std::make_unique<Prepend>(description.at("prepend").get<std::string>());
  if (type == "Replace") return std::make_unique<Replace>(description);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> stages;
    for (const Json& stage : description.at("normalizers")) {
      if (auto made = make_normalizer(stage)) stages.push_back(std::move(made));
    }
    return std::make_unique<Sequence>(std::move(stages));
  }
  fail(
      "tokenizer.json: normalizer type \"{}\" is not supported (supported: NFC, NFD, NFKC, NFKD, "
      "Lowercase, Strip, Prepend, Replace, Sequence)",
      type);
}

PostProcessor make_post_processor(const Json& description) {
  PostProcessor processor;
  if (description.is_null()) return processor;
  std::string type = type_of(description, "post_processor");
  if (type == "ByteLevel") return processor;  // only trims offsets; ids are unchanged
  if (type == "Sequence") {
    for (const Json& stage : description.at("processors")) {
      PostProcessor part = make_post_processor(stage);
      processor.prefix.insert(processor.prefix.end(), part.prefix.begin(), part.prefix.end());
      processor.suffix.insert(processor.suffix.begin(), part.suffix.begin(), part.suffix.end());
    }
    return processor;
  }
  if (type != "TemplateProcessing") {
    fail(
        "tokenizer.json: post_processor type \"{}\" is not supported (supported: "
        "TemplateProcessing, ByteLevel, Sequence)",
        type);
  }
  const Json& specials = description.at("special_tokens");
  bool seen_sequence = false;
  for (const Json& item : description.at("single")) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    std::string name = item.at("SpecialToken").at("id").get<std::string>();
    if (!specials.contains(name))
      fail("tokenizer.json: TemplateProcessing names unknown special token \"{}\"", name);
    auto& target = seen_sequence ? processor.suffix : processor.prefix;
    for (const Json& id : specials[name].at("ids"))
      target.push_back(token_id(id, "a TemplateProcessing special token id"));
  }
  return processor;
}

}  // namespace deepinfer::tokenization

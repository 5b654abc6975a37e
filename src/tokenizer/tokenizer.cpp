#include "tokenizer/tokenizer.h"

#include <array>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "core/json.h"
#include "tokenizer/bpe.h"
#include "tokenizer/components.h"
#include "tokenizer/text.h"

namespace deepinfer {

using tokenization::Json;

namespace {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, normalized = false, single_word = false;
};

// Leftmost-longest matching of added tokens over a byte trie.
class TokenMatcher {
 public:
  struct Match {
    size_t begin, end, token;
  };
  void add(const std::string& pattern, size_t token) {
    if (pattern.empty()) return;
    size_t node = 0;
    for (unsigned char byte : pattern) {
      auto found = nodes_[node].children.find(byte);
      if (found == nodes_[node].children.end()) {
        nodes_[node].children[byte] = nodes_.size();
        node = nodes_.size();
        nodes_.emplace_back();
      } else {
        node = found->second;
      }
    }
    nodes_[node].token = static_cast<int64_t>(token);
    can_start_[static_cast<unsigned char>(pattern[0])] = true;
  }
  bool empty() const { return nodes_.size() == 1; }
  // The longest pattern starting at `at`, or {at, at, npos}.
  Match longest_at(std::string_view text, size_t at) const {
    Match best{at, at, std::string::npos};
    if (!can_start_[static_cast<unsigned char>(text[at])]) return best;
    size_t node = 0;
    for (size_t i = at; i < text.size(); ++i) {
      auto found = nodes_[node].children.find(static_cast<unsigned char>(text[i]));
      if (found == nodes_[node].children.end()) break;
      node = found->second;
      if (nodes_[node].token >= 0) best = {at, i + 1, static_cast<size_t>(nodes_[node].token)};
    }
    return best;
  }

 private:
  struct Node {
    std::map<unsigned char, size_t> children;
    int64_t token = -1;
  };
  std::vector<Node> nodes_{1};
  std::array<bool, 256> can_start_{};  // first bytes of any pattern: most positions skip the trie
};

bool is_word_char(char32_t c) {
  return text::is_alphanumeric(c) || c == '_';
}

// The character ending just before `at`.
char32_t char_before(std::string_view text, size_t at) {
  size_t start = at - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xc0) == 0x80) --start;
  return text::code_point_at(text, start);
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) fail("{}: cannot open", path.string());
  std::stringstream text;
  text << stream.rdbuf();
  return text.str();
}

// tokenizer_config.json names tokens as strings or as {"content": ...} objects.
std::string token_name(const Json& config, const char* key) {
  if (!config.contains(key)) return "";
  const Json& value = config[key];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content")) return value["content"].get<std::string>();
  return "";
}

}  // namespace

struct Tokenizer::Impl {
  std::unique_ptr<tokenization::BpeModel> model;
  std::unique_ptr<tokenization::Normalizer> normalizer;
  std::unique_ptr<tokenization::PreTokenizer> pre_tokenizer;
  std::unique_ptr<tokenization::Decoder> decoder;
  tokenization::PostProcessor post_processor;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;
  std::unordered_map<std::string, int32_t> added_by_content;
  // [mode][normalized]: kSpecials and kAsText; kPlain matches nothing.
  TokenMatcher matchers[2][2];
  std::string bos, eos;

  void build_matchers() {
    for (size_t i = 0; i < added.size(); ++i) {
      const AddedToken& token = added[i];
      std::string pattern = token.content;
      if (token.normalized && normalizer) pattern = normalizer->apply(pattern);
      matchers[0][token.normalized].add(pattern, i);
      if (!token.special) matchers[1][token.normalized].add(pattern, i);
    }
  }

  // Cuts `text` at added tokens; `emit_text` gets the stretches between, `emit_token` the ids.
  // `allowed(begin, end)` may veto a match (client-typed ranges).
  template <typename EmitText, typename EmitToken, typename Allowed>
  void split_added(std::string_view text, const TokenMatcher& matcher, EmitText emit_text,
                   EmitToken emit_token, Allowed allowed) const {
    size_t last = 0;
    size_t at = 0;
    while (at < text.size()) {
      TokenMatcher::Match match = matcher.empty() ? TokenMatcher::Match{at, at, std::string::npos}
                                                  : matcher.longest_at(text, at);
      if (match.token == std::string::npos || !accept(text, match) ||
          !allowed(match.begin, match.end)) {
        at += static_cast<size_t>(text::utf8_length(static_cast<unsigned char>(text[at])));
        continue;
      }
      const AddedToken& token = added[match.token];
      size_t begin = match.begin, end = match.end;
      if (token.lstrip) {
        while (begin > last && text::is_whitespace(char_before(text, begin)))
          begin -= text::utf8_encode(char_before(text, begin)).size();
      }
      if (token.rstrip) {
        while (end < text.size() && text::is_whitespace(text::code_point_at(text, end)))
          end += static_cast<size_t>(text::utf8_length(static_cast<unsigned char>(text[end])));
      }
      if (begin > last) emit_text(text.substr(last, begin - last));
      emit_token(token.id);
      last = at = end;
    }
    if (last < text.size()) emit_text(text.substr(last));
  }

  bool accept(std::string_view text, const TokenMatcher::Match& match) const {
    if (!added[match.token].single_word) return true;
    bool clear_before = match.begin == 0 || !is_word_char(char_before(text, match.begin));
    bool clear_after =
        match.end == text.size() || !is_word_char(text::code_point_at(text, match.end));
    return clear_before && clear_after;
  }

  void encode_text(std::string_view stretch, bool first, std::vector<int32_t>& ids) const {
    tokenization::Pieces pieces(stretch);
    if (pre_tokenizer) pre_tokenizer->split(pieces, first);
    for (size_t i = 0; i < pieces.spans.size(); ++i) model->tokenize(pieces.piece(i), ids);
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::load(const std::filesystem::path& folder) {
  std::filesystem::path path = folder / "tokenizer.json";
  if (!std::filesystem::exists(path))
    fail("{}: no tokenizer.json (is {} a model folder?)", path.string(), folder.string());
  std::filesystem::path config = folder / "tokenizer_config.json";
  std::string config_text = std::filesystem::exists(config) ? read_file(config) : "";
  return from_json(read_file(path), config_text);
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(const std::string& tokenizer_json,
                                                const std::string& config_json) {
  try {
    return build(tokenizer_json, config_json);
  } catch (const nlohmann::json::exception& error) {
    fail("tokenizer.json: malformed ({})", error.what());
  }
}

std::unique_ptr<Tokenizer> Tokenizer::build(const std::string& tokenizer_json,
                                            const std::string& config_json) {
  Json spec = parse_json_or_discarded<Json>(tokenizer_json);
  if (spec.is_discarded() || !spec.is_object()) fail("tokenizer.json: malformed JSON");
  auto impl = std::make_unique<Impl>();
  impl->model = std::make_unique<tokenization::BpeModel>(spec.at("model"));
  impl->normalizer = tokenization::make_normalizer(spec.value("normalizer", Json()));
  impl->pre_tokenizer = tokenization::make_pre_tokenizer(spec.value("pre_tokenizer", Json()));
  impl->decoder = tokenization::make_decoder(spec.value("decoder", Json()));
  impl->post_processor = tokenization::make_post_processor(spec.value("post_processor", Json()));
  for (const Json& entry : spec.value("added_tokens", Json::array())) {
    AddedToken token;
    token.content = entry.at("content").get<std::string>();
    token.id = tokenization::token_id(entry.at("id"), "an added token's id");
    token.special = entry.value("special", false);
    token.lstrip = entry.value("lstrip", false);
    token.rstrip = entry.value("rstrip", false);
    token.normalized = entry.value("normalized", false);
    token.single_word = entry.value("single_word", false);
    impl->added_by_id[token.id] = impl->added.size();
    impl->added_by_content[token.content] = token.id;
    impl->added.push_back(std::move(token));
  }
  impl->build_matchers();
  if (!config_json.empty()) {
    Json config = parse_json_or_discarded<Json>(config_json);
    if (config.is_discarded() || !config.is_object()) fail("tokenizer_config.json: malformed JSON");
    // clean_up_tokenization_spaces is not applied: transformers 5.17 leaves decoded text as
    // the decoder produced it even where the config sets it (Llama 3's golden decodes keep
    // " ." and " 's"), and the streaming detokenizer could not honour it without retracting.
    impl->bos = token_name(config, "bos_token");
    impl->eos = token_name(config, "eos_token");
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, EncodeMode mode,
                                       bool add_special_tokens) const {
  return encode_checked(input, mode, add_special_tokens, {});
}

std::vector<int32_t> Tokenizer::encode_with_plain_ranges(
    std::string_view input, const std::vector<std::pair<size_t, size_t>>& plain) const {
  return encode_checked(input, EncodeMode::kSpecials, false, plain);
}

std::vector<std::string> Tokenizer::added_token_contents() const {
  std::vector<std::string> contents;
  for (const AddedToken& token : impl_->added) contents.push_back(token.content);
  return contents;
}

std::vector<int32_t> Tokenizer::encode_checked(
    std::string_view input, EncodeMode mode, bool add_special_tokens,
    const std::vector<std::pair<size_t, size_t>>& plain) const {
  text::check_utf8(input, "text to encode");
  auto overlaps_plain = [&](size_t begin, size_t end) {
    return std::any_of(plain.begin(), plain.end(), [&](const auto& range) {
      return begin < range.second && range.first < end;
    });
  };
  const Impl& t = *impl_;
  std::vector<int32_t> ids;
  bool first = true;
  static const TokenMatcher kNone;
  auto matcher = [&](bool normalized) -> const TokenMatcher& {
    if (mode == EncodeMode::kPlain) return kNone;
    return t.matchers[mode == EncodeMode::kAsText ? 1 : 0][normalized ? 1 : 0];
  };
  auto add_token = [&](int32_t id) {
    ids.push_back(id);
    first = false;
  };
  t.split_added(
      input, matcher(false),
      [&](std::string_view raw) {
        std::string normalized =
            t.normalizer ? t.normalizer->apply(std::string(raw)) : std::string(raw);
        // Where normalization changed the stretch its offsets moved: a stretch holding client
        // text then matches no normalized added token at all. Unchanged, offsets still apply.
        auto raw_begin = static_cast<size_t>(raw.data() - input.data());
        bool has_plain = overlaps_plain(raw_begin, raw_begin + raw.size());
        bool same_offsets = normalized == raw;
        t.split_added(
            normalized, matcher(true),
            [&](std::string_view stretch) {
              t.encode_text(stretch, first, ids);
              first = false;
            },
            add_token,
            [&](size_t begin, size_t end) {
              if (!has_plain) return true;
              return same_offsets && !overlaps_plain(raw_begin + begin, raw_begin + end);
            });
      },
      add_token, [&](size_t begin, size_t end) { return !overlaps_plain(begin, end); });
  if (add_special_tokens) {
    ids.insert(ids.begin(), t.post_processor.prefix.begin(), t.post_processor.prefix.end());
    ids.insert(ids.end(), t.post_processor.suffix.begin(), t.post_processor.suffix.end());
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto added = t.added_by_id.find(id);
    if (added != t.added_by_id.end()) {
      const AddedToken& token = t.added[added->second];
      if (!(skip_special_tokens && token.special)) tokens.push_back(token.content);
      continue;
    }
    const std::string* token = t.model->id_to_token(id);
    if (token == nullptr) fail("token id {} is outside the vocabulary (size {})", id, vocab_size());
    tokens.push_back(*token);
  }
  std::string text;
  if (t.decoder) {
    t.decoder->decode(tokens);
    for (const std::string& piece : tokens) text += piece;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
  }
  return text;
}

std::vector<std::string> Tokenizer::token_bytes() const {
  const Impl& t = *impl_;
  std::vector<std::string> table(static_cast<size_t>(vocab_size()));
  // Decoders treat the first token specially (a dropped leading space): decode each token
  // after an anchor and cut the anchor's own text off.
  std::optional<int32_t> anchor_id = t.model->token_to_id("a");
  std::string anchor = anchor_id ? *t.model->id_to_token(*anchor_id) : "";
  std::string anchor_text;
  if (t.decoder && anchor_id) {
    std::vector<std::string> alone = {anchor};
    t.decoder->decode_bytes(alone);
    for (const std::string& piece : alone) anchor_text += piece;
  }
  for (int32_t id = 0; id < vocab_size(); ++id) {
    // Added tokens go through the decoder as decode() sends them (Gemma's "▁▁" runs).
    auto added = t.added_by_id.find(id);
    const std::string* token =
        added != t.added_by_id.end() ? &t.added[added->second].content : t.model->id_to_token(id);
    if (token && !t.decoder) {
      table[static_cast<size_t>(id)] = *token;
    } else if (token) {
      std::vector<std::string> pieces = {anchor, *token};
      if (!anchor_id) pieces.erase(pieces.begin());
      t.decoder->decode_bytes(pieces);
      std::string bytes;
      for (const std::string& piece : pieces) bytes += piece;
      table[static_cast<size_t>(id)] = bytes.compare(0, anchor_text.size(), anchor_text) == 0
                                           ? bytes.substr(anchor_text.size())
                                           : bytes;
    }
  }
  return table;
}

void Tokenizer::clear_cache() const {
  impl_->model->clear_cache();
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto added = impl_->added_by_content.find(std::string(token));
  if (added != impl_->added_by_content.end()) return added->second;
  return impl_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  auto added = impl_->added_by_id.find(id);
  if (added != impl_->added_by_id.end()) return impl_->added[added->second].content;
  const std::string* token = impl_->model->id_to_token(id);
  return token ? *token : std::string();
}

int32_t Tokenizer::vocab_size() const {
  int32_t size = impl_->model->size();
  for (const AddedToken& token : impl_->added) size = std::max(size, token.id + 1);
  return size;
}

bool Tokenizer::is_special(int32_t id) const {
  auto added = impl_->added_by_id.find(id);
  return added != impl_->added_by_id.end() && impl_->added[added->second].special;
}

bool Tokenizer::is_added(int32_t id) const {
  return impl_->added_by_id.count(id) != 0;
}

const std::string& Tokenizer::bos_token() const {
  return impl_->bos;
}
const std::string& Tokenizer::eos_token() const {
  return impl_->eos;
}

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

// Decodes ids_[prefix_offset_, read_offset_) (text already emitted) and ids_[prefix_offset_,
// end): the decoder sees the same leading context in both, so their difference is the new text.
std::pair<std::string, std::string> StreamingDetokenizer::decode_window() const {
  auto first = ids_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_);
  std::vector<int32_t> prefix(first, ids_.begin() + static_cast<std::ptrdiff_t>(read_offset_));
  std::vector<int32_t> window(first, ids_.end());
  return {tokenizer_.decode(prefix, skip_special_tokens_),
          tokenizer_.decode(window, skip_special_tokens_)};
}

std::string StreamingDetokenizer::push(int32_t id) {
  ids_.push_back(id);
  auto [prefix_text, text] = decode_window();
  // An incomplete character decodes to U+FFFD at the end: wait for the rest of it.
  bool incomplete = text.size() >= 3 && text.compare(text.size() - 3, 3, "\xef\xbf\xbd") == 0;
  if (incomplete || text.size() <= prefix_text.size() ||
      text.compare(0, prefix_text.size(), prefix_text) != 0) {
    return "";
  }
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return text.substr(prefix_text.size());
}

std::string StreamingDetokenizer::finish() {
  auto [prefix_text, text] = decode_window();
  read_offset_ = prefix_offset_ = ids_.size();
  return text.size() > prefix_text.size() ? text.substr(prefix_text.size()) : "";
}

}  // namespace deepinfer

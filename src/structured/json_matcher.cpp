// The JSON grammar as a byte-level pushdown automaton, and its token mask (token_walk.h).
#include <algorithm>
#include <limits>

#include "core/token_bits.h"
#include "structured/structured.h"
#include "structured/token_walk.h"
#include "structured/utf8.h"

namespace deepinfer::structured {

TokenTable::TokenTable(std::vector<std::string> token_bytes, const std::vector<int32_t>& end_tokens,
                       const std::vector<int32_t>& forbidden)
    : bytes_(std::move(token_bytes)), kind_(bytes_.size(), Kind::kText) {
  for (int32_t id : forbidden)
    if (id >= 0 && id < size()) kind_[static_cast<size_t>(id)] = Kind::kForbidden;
  for (int32_t id : end_tokens) {
    if (id < 0 || id >= size()) continue;
    kind_[static_cast<size_t>(id)] = Kind::kEnd;
    end_tokens_.push_back(id);
  }
  std::vector<int32_t> order;
  for (int32_t id = 0; id < size(); ++id)
    if (kind_[static_cast<size_t>(id)] == Kind::kText && !bytes(id).empty()) order.push_back(id);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return bytes(a) < bytes(b); });
  std::vector<int32_t> sensitive;
  for (int32_t id : order) {
    const std::string& text = bytes(id);
    const auto first = std::find_if(text.begin(), text.end(), [](char c) {
      return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20;
    });
    // Plain tokens continue a string between characters whatever came before; a byte-level
    // vocabulary's fragments of a character (a lone continuation byte, say) do not, so they
    // are walked with the rest. A raw control byte ends any string: a token with one before
    // its first '"' or '\\' can never continue one.
    const bool plain = first == text.end() && utf8_from_boundary(text);
    if (!plain && (first == text.end() || static_cast<unsigned char>(*first) >= 0x20))
      sensitive.push_back(id);
    if (plain) string_plain_.push_back(id);
    if (plain)
      string_plain_chars_.push_back(
          static_cast<uint32_t>(std::count_if(text.begin(), text.end(), [](char c) {
            return (static_cast<uint8_t>(c) & 0xC0) != 0x80;
          })));
  }
  sorted_ = with_shared_prefixes(order);
  string_sensitive_ = with_shared_prefixes(sensitive);
  string_plain_sorted_ = with_shared_prefixes(string_plain_);
  std::vector<int32_t> single;
  std::copy_if(order.begin(), order.end(), std::back_inserter(single),
               [&](int32_t id) { return bytes(id).size() == 1; });
  one_byte_tokens_ = with_shared_prefixes(single);
  index_string_plain();
}

void TokenTable::index_string_plain() {
  const size_t words = (static_cast<size_t>(size()) + 63) / 64;
  plain_within_.assign(kCountedChars + 2, std::vector<uint64_t>(words, 0));
  for (size_t i = 0; i < string_plain_.size(); ++i) {
    const int32_t id = string_plain_[i];
    const uint32_t chars = string_plain_chars_[i];
    plain_max_chars_ = std::max(plain_max_chars_, chars);
    plain_max_bytes_ = std::max(plain_max_bytes_, bytes(id).size());
    if (chars > kCountedChars) plain_long_.emplace_back(id, chars);
    for (uint32_t k = std::min(chars, kCountedChars + 1); k <= kCountedChars + 1; ++k)
      plain_within_[k][static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
  }
}

void TokenTable::allow_string_plain(int64_t max_chars, int64_t max_bytes,
                                    const std::vector<uint64_t>* filter,
                                    std::vector<uint64_t>& allowed) const {
  auto passes = [&](int32_t id) {
    return !filter || ((*filter)[static_cast<size_t>(id) / 64] >> (id % 64) & 1);
  };
  if (max_bytes < static_cast<int64_t>(plain_max_bytes_)) {  // near a key's byte limit: rare
    for (size_t i = 0; i < string_plain_.size(); ++i) {
      const int32_t id = string_plain_[i];
      if (string_plain_chars_[i] <= max_chars &&
          static_cast<int64_t>(bytes(id).size()) <= max_bytes && passes(id))
        allowed[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
    }
    return;
  }
  if (max_chars < 0) return;
  const bool all = max_chars >= static_cast<int64_t>(plain_max_chars_);
  const std::vector<uint64_t>& within =
      plain_within_[all ? kCountedChars + 1
                        : static_cast<size_t>(std::min<int64_t>(max_chars, kCountedChars))];
  for (size_t word = 0; word < within.size(); ++word)
    allowed[word] |= within[word] & (filter ? (*filter)[word] : ~uint64_t{0});
  if (all || max_chars <= static_cast<int64_t>(kCountedChars)) return;
  for (const auto& [id, chars] : plain_long_)
    if (chars <= max_chars && passes(id))
      allowed[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
}

bool TokenMask::allows_any(int32_t vocab_size) const {
  if (free()) return vocab_size > 0;
  const int32_t known = std::min(vocab_size, tokens);
  for (int32_t word = 0; word * 64 < known; ++word) {
    const int32_t count = std::min(64, known - word * 64);
    const uint64_t in_range = count == 64 ? ~uint64_t{0} : (uint64_t{1} << count) - 1;
    if ((*bits)[static_cast<size_t>(word)] & in_range) return true;
  }
  return false;
}

void Matcher::apply(const TokenMask& mask, float* logits, int32_t vocab_size) {
  if (!mask.free()) ban_unmarked(mask.bits->data(), mask.tokens, logits, vocab_size);
}

TokenTable::Bits TokenTable::shared_bits(const BitsKey& key,
                                         const std::function<std::vector<uint64_t>()>& make) const {
  {
    std::lock_guard lock(shared_mutex_);
    if (auto found = shared_bits_.find(key); found != shared_bits_.end()) return found->second;
  }
  auto made = std::make_shared<const std::vector<uint64_t>>(make());
  std::lock_guard lock(shared_mutex_);
  if (shared_bits_.size() >= kMaxSharedBits) shared_bits_.clear();
  return shared_bits_.emplace(key, std::move(made)).first->second;
}

std::shared_ptr<const TokenTable> TokenTable::single_bytes() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  bytes.emplace_back("<eos>");
  return std::make_shared<TokenTable>(std::move(bytes), std::vector<int32_t>{256},
                                      std::vector<int32_t>{});
}

SortedTokens::SortedTokens(std::vector<Entry> entries) : entries_(std::move(entries)) {
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (i % kBlock == 0) block_min_.push_back(entries_[i].second);
    if (i % kSuperBlock == 0) super_block_min_.push_back(entries_[i].second);
    block_min_.back() = std::min(block_min_.back(), entries_[i].second);
    super_block_min_.back() = std::min(super_block_min_.back(), entries_[i].second);
  }
}

size_t SortedTokens::next_within(size_t from, uint32_t depth) const {
  size_t i = from;
  while (i < entries_.size()) {
    if (i % kSuperBlock == 0 && super_block_min_[i / kSuperBlock] > depth) {
      i += kSuperBlock;
    } else if (i % kBlock == 0 && block_min_[i / kBlock] > depth) {
      i += kBlock;
    } else if (entries_[i].second <= depth) {
      return i;
    } else {
      ++i;
    }
  }
  return entries_.size();
}

SortedTokens TokenTable::with_shared_prefixes(const std::vector<int32_t>& order) const {
  std::vector<std::pair<int32_t, uint32_t>> out;
  out.reserve(order.size());
  const std::string* previous = nullptr;
  for (int32_t id : order) {
    const std::string& current = bytes(id);
    uint32_t shared = 0;
    if (previous) {
      size_t limit = std::min(previous->size(), current.size());
      while (shared < limit && (*previous)[shared] == current[shared]) ++shared;
    }
    out.emplace_back(id, shared);
    previous = &current;
  }
  return SortedTokens(std::move(out));
}

namespace {

constexpr int kMaxWhitespaceRun = 48;

bool is_space(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
bool is_digit(unsigned char c) {
  return c >= '0' && c <= '9';
}
bool is_hex(unsigned char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// Where the automaton is. Small and copyable: the mask walk keeps one per prefix depth.
struct JsonState {
  enum Mode : uint8_t {
    kStart,        // before the top-level object
    kValue,        // a value must come
    kArrayFirst,   // after '[': a value or ']'
    kObjectFirst,  // after '{': a key or '}'
    kKey,          // after ',' in an object: a key
    kColon,        // after a key
    kAfter,        // after a value in a container: ',' or the close
    kString,
    kEscape,
    kUnicode,
    kMinus,      // "-": a digit must come
    kZero,       // "0": no more integer digits
    kInt,        // integer digits
    kFracStart,  // ".": a digit must come
    kFrac,
    kExpStart,  // "e": sign or digit
    kExpSign,   // "e+": a digit must come
    kExp,
    kLiteral,  // inside true/false/null
    kDone,     // the object is closed: only an end token
  };
  Mode mode = kStart;
  bool key = false;     // the string being read is an object key
  uint8_t count = 0;    // hex digits left (kUnicode), literal position (kLiteral)
  uint8_t literal = 0;  // which literal
  uint8_t spaces = 0;   // length of the current whitespace run
  uint8_t utf8 = 0;     // in a string: where in a multi-byte character (utf8_next's state)
  std::string stack;    // open containers, '{' or '['

  bool feed(uint8_t c) {
    if (is_space(c) && mode != kString && mode != kEscape && mode != kUnicode && !in_number() &&
        mode != kLiteral) {
      return mode != kDone && ++spaces <= kMaxWhitespaceRun;
    }
    spaces = 0;
    return step(c);
  }

 private:
  static constexpr const char* kLiterals[] = {"true", "false", "null"};

  bool in_number() const { return mode >= kMinus && mode <= kExp; }

  void value_done() { mode = stack.empty() ? kDone : kAfter; }

  bool start_value(unsigned char c) {
    switch (c) {
      case '{':
        stack.push_back('{');
        mode = kObjectFirst;
        return true;
      case '[':
        stack.push_back('[');
        mode = kArrayFirst;
        return true;
      case '"':
        mode = kString;
        key = false;
        return true;
      case '-':
        mode = kMinus;
        return true;
      case 't':
      case 'f':
      case 'n':
        literal = c == 't' ? 0 : c == 'f' ? 1 : 2;
        count = 1;
        mode = kLiteral;
        return true;
      default:
        if (!is_digit(c)) return false;
        mode = c == '0' ? kZero : kInt;
        return true;
    }
  }

  bool close(unsigned char c) {
    if (stack.empty() || (c == '}' ? '{' : '[') != stack.back()) return false;
    stack.pop_back();
    value_done();
    return true;
  }

  // A byte that ends a number is read again as what follows the value.
  bool end_number(unsigned char c) {
    value_done();
    if (is_space(c)) return feed(c);
    return step(c);
  }

  bool step(unsigned char c) {
    switch (mode) {
      case kStart:
        return c == '{' && start_value(c);
      case kValue:
        return start_value(c);
      case kArrayFirst:
        return c == ']' ? close(c) : start_value(c);
      case kObjectFirst:
      case kKey:
        if (c == '}' && mode == kObjectFirst) return close(c);
        if (c != '"') return false;
        mode = kString;
        key = true;
        return true;
      case kColon:
        if (c != ':') return false;
        mode = kValue;
        return true;
      case kAfter:
        if (c == ',') {
          mode = stack.back() == '{' ? kKey : kValue;
          return true;
        }
        return (c == '}' || c == ']') && close(c);
      case kString:
        if (utf8 != 0 || c >= 0x80) {  // JSON text is UTF-8: whole, well-formed characters
          const int next = utf8_next(utf8, c);
          if (next < 0) return false;
          utf8 = static_cast<uint8_t>(next);
          return true;
        }
        if (c == '"') {
          if (key) {
            mode = kColon;
          } else {
            value_done();
          }
          return true;
        }
        if (c == '\\') mode = kEscape;
        return c >= 0x20;
      case kEscape:
        if (c == 'u') {
          mode = kUnicode;
          count = 4;
          return true;
        }
        mode = kString;
        return std::string_view("\"\\/bfnrt").find(static_cast<char>(c)) != std::string_view::npos;
      case kUnicode:
        if (!is_hex(c)) return false;
        if (--count == 0) mode = kString;
        return true;
      case kLiteral: {
        std::string_view word = kLiterals[literal];
        if (c != static_cast<unsigned char>(word[count])) return false;
        if (++count == word.size()) value_done();
        return true;
      }
      case kDone:
        return false;
      default:
        return step_number(c);
    }
  }

  bool step_number(unsigned char c) {
    bool digit = is_digit(c);
    switch (mode) {
      case kMinus:
        if (!digit) return false;
        mode = c == '0' ? kZero : kInt;
        return true;
      case kZero:
      case kInt:
        if (digit && mode == kInt) return true;
        if (c == '.') {
          mode = kFracStart;
          return true;
        }
        if (c == 'e' || c == 'E') {
          mode = kExpStart;
          return true;
        }
        return !digit && end_number(c);
      case kFracStart:
        if (!digit) return false;
        mode = kFrac;
        return true;
      case kFrac:
        if (digit) return true;
        if (c == 'e' || c == 'E') {
          mode = kExpStart;
          return true;
        }
        return end_number(c);
      case kExpStart:
        if (c == '+' || c == '-') {
          mode = kExpSign;
          return true;
        }
        [[fallthrough]];
      case kExpSign:
        if (!digit) return false;
        mode = kExp;
        return true;
      case kExp:
        return digit || end_number(c);
      default:
        return false;
    }
  }
};

class JsonMatcher final : public Matcher {
 public:
  explicit JsonMatcher(std::shared_ptr<const TokenTable> table) : table_(std::move(table)) {}

  std::unique_ptr<Matcher> clone() const override { return std::make_unique<JsonMatcher>(*this); }

  TokenMask allowed() const override {
    std::vector<uint64_t> bits((static_cast<size_t>(table_->size()) + 63) / 64, 0);
    if (complete()) {
      for (int32_t id : table_->end_tokens()) mark(bits, id);
    } else if (state_.mode == JsonState::kString && state_.utf8 == 0) {
      table_->allow_string_plain(INT64_MAX, INT64_MAX, nullptr, bits);
      allow_fed_tokens(state_, *table_, table_->string_sensitive(), bits);
    } else {
      allow_fed_tokens(state_, *table_, table_->sorted(), bits);
    }
    return {std::make_shared<const std::vector<uint64_t>>(std::move(bits)), table_->size()};
  }

  bool accept(int32_t token) override {
    if (token < 0 || token >= table_->size()) return false;
    if (table_->is_end(token)) return complete();
    JsonState next = state_;
    const std::string& bytes = table_->bytes(token);
    if (bytes.empty()) return false;
    for (char c : bytes)
      if (!next.feed(static_cast<unsigned char>(c))) return false;
    state_ = std::move(next);
    return true;
  }

  bool complete() const override { return state_.mode == JsonState::kDone; }

 private:
  std::shared_ptr<const TokenTable> table_;
  JsonState state_;
};

class JsonObjectConstraint final : public Constraint {
 public:
  explicit JsonObjectConstraint(std::shared_ptr<const TokenTable> table)
      : table_(std::move(table)) {}
  std::unique_ptr<Matcher> start() const override { return std::make_unique<JsonMatcher>(table_); }

 private:
  std::shared_ptr<const TokenTable> table_;
};

class AfterReasoningMatcher final : public Matcher {
 public:
  enum class Phase { kUndecided, kReasoning, kInner };
  AfterReasoningMatcher(std::unique_ptr<Matcher> inner, int32_t start, int32_t end, Phase phase)
      : inner_(std::move(inner)), start_(start), end_(end), phase_(phase) {}
  AfterReasoningMatcher(const AfterReasoningMatcher& other)
      : inner_(other.inner_->clone()),
        start_(other.start_),
        end_(other.end_),
        phase_(other.phase_) {}

  std::unique_ptr<Matcher> clone() const override {
    return std::make_unique<AfterReasoningMatcher>(*this);
  }
  TokenMask allowed() const override {
    if (phase_ == Phase::kReasoning) return {};
    TokenMask mask = inner_->allowed();
    if (phase_ != Phase::kUndecided || mask.free() || start_ < 0 || start_ >= mask.tokens)
      return mask;
    auto with_start = std::make_shared<std::vector<uint64_t>>(*mask.bits);
    mark(*with_start, start_);  // reasoning may open first
    return {std::move(with_start), mask.tokens};
  }
  bool accept(int32_t token) override {
    if (phase_ == Phase::kReasoning) {
      if (token == end_) phase_ = Phase::kInner;
      return true;
    }
    if (phase_ == Phase::kUndecided && token == start_) {
      phase_ = Phase::kReasoning;
      return true;
    }
    if (!inner_->accept(token)) return false;
    phase_ = Phase::kInner;
    return true;
  }
  bool complete() const override { return phase_ == Phase::kInner && inner_->complete(); }

 private:
  std::unique_ptr<Matcher> inner_;
  int32_t start_, end_;
  Phase phase_;
};

class AfterReasoning final : public Constraint {
 public:
  AfterReasoning(std::shared_ptr<const Constraint> inner, int32_t start, int32_t end,
                 bool starts_in_reasoning)
      : inner_(std::move(inner)), start_(start), end_(end), starts_in_(starts_in_reasoning) {}
  std::unique_ptr<Matcher> start() const override {
    using Phase = AfterReasoningMatcher::Phase;
    return std::make_unique<AfterReasoningMatcher>(
        inner_->start(), start_, end_, starts_in_ ? Phase::kReasoning : Phase::kUndecided);
  }

 private:
  std::shared_ptr<const Constraint> inner_;
  int32_t start_, end_;
  bool starts_in_;
};

class ThenFreeMatcher final : public Matcher {
 public:
  explicit ThenFreeMatcher(std::unique_ptr<Matcher> inner) : inner_(std::move(inner)) {}
  ThenFreeMatcher(const ThenFreeMatcher& other)
      : inner_(other.inner_ ? other.inner_->clone() : nullptr) {}

  std::unique_ptr<Matcher> clone() const override {
    return std::make_unique<ThenFreeMatcher>(*this);
  }
  TokenMask allowed() const override { return inner_ ? inner_->allowed() : TokenMask{}; }
  bool accept(int32_t token) override {
    if (!inner_) return true;
    if (!inner_->accept(token)) return false;
    if (inner_->complete()) inner_.reset();  // free from here
    return true;
  }
  bool complete() const override { return !inner_; }

 private:
  std::unique_ptr<Matcher> inner_;  // null once it is complete
};

// The tokens of a closing text one at a time, then (when `end`) an end token alone.
struct ClosingTokens {
  std::vector<TokenMask> steps;  // steps[i]: the i-th closing token; last: the end tokens
  std::vector<int32_t> ids;
};

class ThenClosingMatcher final : public Matcher {
 public:
  ThenClosingMatcher(std::unique_ptr<Matcher> inner, std::shared_ptr<const ClosingTokens> closing)
      : inner_(std::move(inner)), closing_(std::move(closing)) {}
  ThenClosingMatcher(const ThenClosingMatcher& other)
      : inner_(other.inner_ ? other.inner_->clone() : nullptr),
        closing_(other.closing_),
        written_(other.written_) {}

  std::unique_ptr<Matcher> clone() const override {
    return std::make_unique<ThenClosingMatcher>(*this);
  }
  TokenMask allowed() const override {
    if (inner_) return inner_->allowed();
    return written_ < closing_->steps.size() ? closing_->steps[written_] : TokenMask{};
  }
  bool accept(int32_t token) override {
    if (inner_) {
      if (!inner_->accept(token)) return false;
      if (inner_->complete()) inner_.reset();
      return true;
    }
    if (written_ < closing_->ids.size()) {
      if (token != closing_->ids[written_]) return false;
      ++written_;
      return true;
    }
    // After the closing text: an end token when one is required, else anything.
    return written_ == closing_->steps.size() || closing_->steps.back().allows(token);
  }
  bool complete() const override { return !inner_ && written_ >= closing_->ids.size(); }

 private:
  std::unique_ptr<Matcher> inner_;  // null once it is complete
  std::shared_ptr<const ClosingTokens> closing_;
  size_t written_ = 0;  // closing tokens written
};

class ThenClosing final : public Constraint {
 public:
  ThenClosing(std::shared_ptr<const Constraint> inner, const TokenTable& table,
              std::vector<int32_t> closing, bool end)
      : inner_(std::move(inner)) {
    auto tokens = std::make_shared<ClosingTokens>();
    const size_t words = (static_cast<size_t>(table.size()) + 63) / 64;
    auto only = [&](const std::vector<int32_t>& ids) {
      std::vector<uint64_t> bits(words, 0);
      for (int32_t id : ids)
        if (id >= 0 && id < table.size()) mark(bits, id);
      return TokenMask{std::make_shared<const std::vector<uint64_t>>(std::move(bits)),
                       table.size()};
    };
    for (int32_t id : closing) tokens->steps.push_back(only({id}));
    if (end) tokens->steps.push_back(only(table.end_tokens()));
    tokens->ids = std::move(closing);
    closing_ = std::move(tokens);
  }
  std::unique_ptr<Matcher> start() const override {
    return std::make_unique<ThenClosingMatcher>(inner_->start(), closing_);
  }

 private:
  std::shared_ptr<const Constraint> inner_;
  std::shared_ptr<const ClosingTokens> closing_;
};

class AfterEachMatcher final : public Matcher {
 public:
  AfterEachMatcher(int32_t trigger, std::shared_ptr<const Constraint> inner)
      : trigger_(trigger), inner_(std::move(inner)) {}
  AfterEachMatcher(const AfterEachMatcher& other)
      : trigger_(other.trigger_),
        inner_(other.inner_),
        active_(other.active_ ? other.active_->clone() : nullptr) {}

  std::unique_ptr<Matcher> clone() const override {
    return std::make_unique<AfterEachMatcher>(*this);
  }
  TokenMask allowed() const override { return active_ ? active_->allowed() : TokenMask{}; }
  bool accept(int32_t token) override {
    if (!active_) {
      if (token == trigger_) active_ = inner_->start();
      return true;
    }
    if (!active_->accept(token)) return false;
    if (active_->complete()) active_.reset();
    return true;
  }
  bool complete() const override { return !active_; }

 private:
  int32_t trigger_;
  std::shared_ptr<const Constraint> inner_;
  std::unique_ptr<Matcher> active_;  // the constrained stretch in progress, if any
};

class AfterEach final : public Constraint {
 public:
  AfterEach(int32_t trigger, std::shared_ptr<const Constraint> inner)
      : trigger_(trigger), inner_(std::move(inner)) {}
  std::unique_ptr<Matcher> start() const override {
    return std::make_unique<AfterEachMatcher>(trigger_, inner_);
  }

 private:
  int32_t trigger_;
  std::shared_ptr<const Constraint> inner_;
};

class ThenFree final : public Constraint {
 public:
  explicit ThenFree(std::shared_ptr<const Constraint> inner) : inner_(std::move(inner)) {}
  std::unique_ptr<Matcher> start() const override {
    return std::make_unique<ThenFreeMatcher>(inner_->start());
  }

 private:
  std::shared_ptr<const Constraint> inner_;
};

}  // namespace

std::shared_ptr<const Constraint> after_each(int32_t trigger,
                                             std::shared_ptr<const Constraint> inner) {
  return std::make_shared<AfterEach>(trigger, std::move(inner));
}

std::shared_ptr<const Constraint> then_free(std::shared_ptr<const Constraint> inner) {
  return std::make_shared<ThenFree>(std::move(inner));
}

std::shared_ptr<const Constraint> then_closing(std::shared_ptr<const Constraint> inner,
                                               const TokenTable& table,
                                               std::vector<int32_t> closing, bool end) {
  end = end && !table.end_tokens().empty();
  if (closing.empty() && !end) return then_free(std::move(inner));
  return std::make_shared<ThenClosing>(std::move(inner), table, std::move(closing), end);
}

std::shared_ptr<const Constraint> after_reasoning(std::shared_ptr<const Constraint> inner,
                                                  int32_t reasoning_start, int32_t reasoning_end,
                                                  bool starts_in_reasoning) {
  return std::make_shared<AfterReasoning>(std::move(inner), reasoning_start, reasoning_end,
                                          starts_in_reasoning);
}

std::shared_ptr<const Constraint> json_object_constraint(std::shared_ptr<const TokenTable> table) {
  return std::make_shared<JsonObjectConstraint>(std::move(table));
}

}  // namespace deepinfer::structured

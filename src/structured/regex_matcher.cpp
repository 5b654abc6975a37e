// Regex and choice constraints: the ByteDfa's state is all a matcher holds, so the set of
// tokens allowed in a state is worked out once (a walk of the sorted vocabulary) and every
// later step in that state only applies it.
#include <array>
#include <cstring>
#include <limits>
#include <map>

#include "structured/regex.h"
#include "structured/structured.h"
#include "structured/token_walk.h"

namespace deepinfer::structured {
namespace {

// The tokens allowed in each automaton state, as bits by token id, made on first use. At
// most kMaxMasks are kept (19 KB each for a 151k vocabulary): past that the cache starts over,
// and masks in use stay alive with their users.
class MaskCache {
 public:
  using Mask = std::shared_ptr<const std::vector<uint64_t>>;
  static constexpr size_t kMaxMasks = 1024;

  MaskCache(const ByteDfa& dfa, const TokenTable& table) : dfa_(dfa), table_(table) {}

  Mask allowed(int state) const {
    {
      std::lock_guard lock(mutex_);
      if (auto found = masks_.find(state); found != masks_.end()) return found->second;
    }
    auto made = std::make_shared<const std::vector<uint64_t>>(build(state));
    std::lock_guard lock(mutex_);
    if (masks_.size() >= kMaxMasks) masks_.clear();
    return masks_.emplace(state, std::move(made)).first->second;
  }

 private:
  // states[d] is the automaton after the first d bytes of the current token; `valid` is how
  // deep the previous token got (a token that shares a longer prefix with it fails too).
  std::vector<uint64_t> build(int state) const {
    std::vector<uint64_t> bits((static_cast<size_t>(table_.size()) + 63) / 64, 0);
    auto allow = [&](int32_t id) { bits[static_cast<size_t>(id) / 64] |= 1ull << (id % 64); };
    std::vector<int> states(1, state);
    size_t valid = 0;
    for (const auto& [id, shared] : table_.sorted()) {
      if (shared > valid) continue;
      const std::string& bytes = table_.bytes(id);
      states.resize(shared + 1);
      size_t depth = shared;
      for (; depth < bytes.size(); ++depth) {
        const int next = dfa_.next(states[depth], static_cast<uint8_t>(bytes[depth]));
        if (next == ByteDfa::kDead) break;
        states.push_back(next);
      }
      valid = depth;
      if (depth == bytes.size()) allow(id);
    }
    if (dfa_.accepting(state))
      for (int32_t id : table_.end_tokens()) allow(id);
    return bits;
  }

  const ByteDfa& dfa_;
  const TokenTable& table_;
  mutable std::mutex mutex_;
  mutable std::map<int, Mask> masks_;
};

struct RegexProgram {
  RegexProgram(const RegexTree& tree, std::shared_ptr<const TokenTable> tokens)
      : dfa(tree), table(std::move(tokens)), masks(dfa, *table) {}
  ByteDfa dfa;
  std::shared_ptr<const TokenTable> table;
  MaskCache masks;
};

class RegexMatcher final : public Matcher {
 public:
  explicit RegexMatcher(std::shared_ptr<const RegexProgram> program)
      : program_(std::move(program)) {}

  std::unique_ptr<Matcher> clone() const override { return std::make_unique<RegexMatcher>(*this); }

  void mask_logits(float* logits, int32_t vocab_size) const override {
    apply_mask_bits(*program_->masks.allowed(state_), program_->table->size(), logits, vocab_size);
  }

  bool accept(int32_t token) override {
    const TokenTable& table = *program_->table;
    if (token < 0 || token >= table.size()) return false;
    if (table.is_end(token)) return complete();
    const std::string& bytes = table.bytes(token);
    if (bytes.empty()) return false;
    int state = state_;
    for (char c : bytes) {
      state = program_->dfa.next(state, static_cast<uint8_t>(c));
      if (state == ByteDfa::kDead) return false;
    }
    state_ = state;
    return true;
  }

  bool complete() const override { return program_->dfa.accepting(state_); }

 private:
  std::shared_ptr<const RegexProgram> program_;
  int state_ = ByteDfa::kStart;
};

class RegexConstraint final : public Constraint {
 public:
  explicit RegexConstraint(std::shared_ptr<const RegexProgram> program)
      : program_(std::move(program)) {}
  std::unique_ptr<Matcher> start() const override {
    return std::make_unique<RegexMatcher>(program_);
  }

 private:
  std::shared_ptr<const RegexProgram> program_;
};

}  // namespace

std::shared_ptr<const Constraint> regex_constraint(std::shared_ptr<const TokenTable> table,
                                                   std::string_view pattern) {
  return std::make_shared<RegexConstraint>(
      std::make_shared<RegexProgram>(RegexTree::parse(pattern), std::move(table)));
}

std::shared_ptr<const Constraint> choice_constraint(std::shared_ptr<const TokenTable> table,
                                                    const std::vector<std::string>& choices) {
  return std::make_shared<RegexConstraint>(
      std::make_shared<RegexProgram>(RegexTree::choice(choices), std::move(table)));
}

}  // namespace deepinfer::structured

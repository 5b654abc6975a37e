// Token masks of one byte automaton, per state, cached: the tokens it reads whole from a state
// without dying.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "structured/regex.h"
#include "structured/structured.h"
#include "structured/token_walk.h"

namespace deepinfer::structured {

// The tokens an automaton reads whole from each state, as bits by token id, made on first use.
// At most `max_masks` are kept (19 KB each for a 151k vocabulary): past that the cache starts
// over, and masks in use stay alive with their users.
class DfaMaskCache {
 public:
  using Mask = std::shared_ptr<const std::vector<uint64_t>>;
  // `ends`: the end tokens are allowed in accepting states (the automaton is the whole
  // output), else never (it is one terminal of a grammar).
  DfaMaskCache(const ByteDfa& dfa, const TokenTable& table, bool ends, size_t max_masks)
      : dfa_(dfa), table_(table), ends_(ends), max_masks_(max_masks) {}

  Mask allowed(int state) const {
    {
      std::lock_guard lock(mutex_);
      if (auto found = masks_.find(state); found != masks_.end()) return found->second;
    }
    auto made = std::make_shared<const std::vector<uint64_t>>(build(state));
    std::lock_guard lock(mutex_);
    if (masks_.size() >= max_masks_) masks_.clear();
    return masks_.emplace(state, std::move(made)).first->second;
  }

 private:
  // states[d] is the automaton after the first d bytes of the current token; `valid` is how
  // deep the previous token got (a token that shares a longer prefix with it fails too).
  std::vector<uint64_t> build(int state) const {
    std::vector<uint64_t> bits((static_cast<size_t>(table_.size()) + 63) / 64, 0);
    allow_dfa_tokens(dfa_, state, table_, table_.sorted(), bits);
    if (ends_ && dfa_.accepting(state))
      for (int32_t id : table_.end_tokens()) mark(bits, id);
    return bits;
  }

  const ByteDfa& dfa_;
  const TokenTable& table_;
  bool ends_;
  size_t max_masks_;
  mutable std::mutex mutex_;
  mutable std::map<int, Mask> masks_;
};

}  // namespace deepinfer::structured

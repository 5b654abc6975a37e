// From RegexTree to ByteDfa: a Thompson automaton over bytes (code point ranges become UTF-8
// byte-range sequences), then the subset construction over classes of bytes that every
// transition treats alike.
#include <xxhash.h>

#include <algorithm>
#include <map>

#include "structured/regex.h"

namespace deepinfer::structured {
namespace {

// A state either reads one byte in [low, high] and goes to `next`, or moves on `epsilon`.
struct NfaState {
  uint8_t low = 0, high = 0;
  int next = -1;
  std::vector<int> epsilon;
};

class Nfa {
 public:
  static constexpr size_t kMaxStates = 200000;

  explicit Nfa(const RegexTree& tree) : tree_(tree) {
    start_ = add();
    accept_ = add();
    auto [first, last] = build(tree.root);
    link(start_, first);
    link(last, accept_);
  }
  const std::vector<NfaState>& states() const { return states_; }
  int start() const { return start_; }
  int accept() const { return accept_; }

 private:
  using Fragment = std::pair<int, int>;  // entry state, exit state (no moves of its own yet)

  int add() {
    if (states_.size() >= kMaxStates)
      throw GrammarError(fmt::format(
          "regex: the pattern needs more than {} automaton states (large repeats?)", kMaxStates));
    states_.emplace_back();
    return static_cast<int>(states_.size()) - 1;
  }
  void link(int from, int to) { states_[static_cast<size_t>(from)].epsilon.push_back(to); }
  int read(uint8_t low, uint8_t high, int to) {
    const int state = add();
    NfaState& s = states_[static_cast<size_t>(state)];
    s.low = low;
    s.high = high;
    s.next = to;
    return state;
  }

  Fragment build(int index) {
    const RegexNode& node = tree_.nodes[static_cast<size_t>(index)];
    switch (node.kind) {
      case RegexNode::Kind::kEmpty: {
        const int state = add();
        return {state, state};
      }
      case RegexNode::Kind::kChars:
        return characters(node.chars);
      case RegexNode::Kind::kConcat: {
        const int entry = add();
        int exit = entry;
        for (int child : node.children) {
          auto [first, last] = build(child);
          link(exit, first);
          exit = last;
        }
        return {entry, exit};
      }
      case RegexNode::Kind::kAlternation: {
        const int entry = add(), exit = add();
        for (int child : node.children) {
          auto [first, last] = build(child);
          link(entry, first);
          link(last, exit);
        }
        return {entry, exit};
      }
      case RegexNode::Kind::kRepeat:
        return repeat(node);
    }
    return {add(), add()};
  }

  // x{min,max}: min copies, then max - min optional ones nested (or a loop when unbounded).
  Fragment repeat(const RegexNode& node) {
    const int entry = add();
    int exit = entry;
    for (int i = 0; i < node.min; ++i) {
      auto [first, last] = build(node.children[0]);
      link(exit, first);
      exit = last;
    }
    const int end = add();
    link(exit, end);
    if (node.max < 0) {
      auto [first, last] = build(node.children[0]);
      link(exit, first);
      link(last, exit);
      return {entry, end};
    }
    for (int i = node.min; i < node.max; ++i) {
      auto [first, last] = build(node.children[0]);
      link(exit, first);
      link(last, end);
      exit = last;
    }
    return {entry, end};
  }

  // A set of code points as alternatives of UTF-8 byte-range sequences.
  Fragment characters(const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
    const int entry = add(), exit = add();
    for (const auto& [low, high] : ranges) utf8_ranges(low, high, entry, exit);
    return {entry, exit};
  }

  static int encoded_length(uint32_t code) {
    return code < 0x80 ? 1 : code < 0x800 ? 2 : code < 0x10000 ? 3 : 4;
  }
  static void encode(uint32_t code, int length, uint8_t* out) {
    static constexpr uint8_t kLead[] = {0, 0, 0xC0, 0xE0, 0xF0};
    for (int i = length - 1; i > 0; --i) {
      out[i] = static_cast<uint8_t>(0x80 | (code & 0x3F));
      code >>= 6;
    }
    out[0] = static_cast<uint8_t>(length == 1 ? code : (kLead[length] | code));
  }

  // Splits [low, high] until each piece is a product of byte ranges, one per position: pieces
  // of one encoded length whose lower continuation bytes run over their whole range.
  void utf8_ranges(uint32_t low, uint32_t high, int entry, int exit) {
    static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF};
    for (uint32_t end : kLengthEnds) {
      if (low <= end && high > end) {
        utf8_ranges(low, end, entry, exit);
        utf8_ranges(end + 1, high, entry, exit);
        return;
      }
    }
    const int length = encoded_length(low);
    for (int i = 1; i < length; ++i) {
      const uint32_t mask = (1u << (6 * i)) - 1;
      if ((low & ~mask) == (high & ~mask)) continue;
      if ((low & mask) != 0) {
        utf8_ranges(low, low | mask, entry, exit);
        utf8_ranges((low | mask) + 1, high, entry, exit);
        return;
      }
      if ((high & mask) != mask) {
        utf8_ranges(low, (high & ~mask) - 1, entry, exit);
        utf8_ranges(high & ~mask, high, entry, exit);
        return;
      }
    }
    uint8_t lows[4], highs[4];
    encode(low, length, lows);
    encode(high, length, highs);
    int to = exit;
    for (int i = length - 1; i >= 0; --i) to = read(lows[i], highs[i], to);
    link(entry, to);
  }

  const RegexTree& tree_;
  std::vector<NfaState> states_;
  int start_ = 0, accept_ = 0;
};

// The states reachable from `seeds` by epsilon moves, sorted.
std::vector<int> closure(const Nfa& nfa, std::vector<int> seeds, std::vector<uint8_t>& seen) {
  std::vector<int> out, stack = std::move(seeds);
  while (!stack.empty()) {
    const int state = stack.back();
    stack.pop_back();
    if (seen[static_cast<size_t>(state)]) continue;
    seen[static_cast<size_t>(state)] = 1;
    out.push_back(state);
    for (int next : nfa.states()[static_cast<size_t>(state)].epsilon) stack.push_back(next);
  }
  for (int state : out) seen[static_cast<size_t>(state)] = 0;
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

ByteDfa::ByteDfa(const RegexTree& tree) {
  const Nfa nfa(tree);
  // Byte classes: bytes no transition tells apart share a column.
  std::vector<uint8_t> boundary(257, 0);
  for (const NfaState& state : nfa.states()) {
    if (state.next < 0) continue;
    boundary[state.low] = 1;
    boundary[static_cast<size_t>(state.high) + 1] = 1;
  }
  int current = -1;
  std::vector<uint8_t> representative;
  for (int byte = 0; byte < 256; ++byte) {
    if (byte == 0 || boundary[static_cast<size_t>(byte)]) {
      ++current;
      representative.push_back(static_cast<uint8_t>(byte));
    }
    byte_class_[static_cast<size_t>(byte)] = static_cast<uint8_t>(current);
  }
  classes_ = representative.size();

  std::map<std::vector<int>, int> ids;
  std::vector<std::vector<int>> sets{{}};  // the dead state
  std::vector<uint8_t> seen(nfa.states().size(), 0);
  sets.push_back(closure(nfa, {nfa.start()}, seen));
  ids[sets[0]] = kDead;
  ids[sets[1]] = kStart;
  // Work is counted in NFA states visited (each target set costs its closure, sort and lookup
  // about kLookupWork times its size), so no pattern costs more than a fraction of a second.
  size_t work = 0;
  auto charge = [&work](size_t amount) {
    work += amount;
    if (work > kMaxWork)
      throw GrammarError(
          "regex: the pattern needs too much work to compile (nested or long bounded repeats "
          "of wide classes?)");
  };
  for (size_t state = 0; state < sets.size(); ++state) {
    for (uint8_t byte : representative) {
      charge(sets[state].size());
      std::vector<int> seeds;
      for (int member : sets[state]) {
        const NfaState& s = nfa.states()[static_cast<size_t>(member)];
        if (s.next >= 0 && byte >= s.low && byte <= s.high) seeds.push_back(s.next);
      }
      std::vector<int> target = closure(nfa, std::move(seeds), seen);
      charge(target.size() * kLookupWork);
      auto [found, added] = ids.emplace(std::move(target), static_cast<int>(sets.size()));
      if (added) {
        if (sets.size() >= static_cast<size_t>(kMaxStates))
          throw GrammarError(
              fmt::format("regex: the pattern needs more than {} automaton states", kMaxStates));
        sets.push_back(found->first);
      }
      moves_.push_back(found->second);
    }
  }
  accepting_.resize(sets.size(), 0);
  final_.resize(sets.size(), 0);
  for (size_t state = 0; state < sets.size(); ++state)
    accepting_[state] = std::binary_search(sets[state].begin(), sets[state].end(), nfa.accept());
  // A state from which no accepting one can be reached (an empty class such as [^\s\S] makes
  // them) is as good as dead: moving there would strand the output.
  // Found backwards from the accepting states over the moves reversed, once each (a sweep
  // repeated until nothing changes takes a pass per state of a long chain such as .{800}).
  std::vector<uint8_t> live(accepting_);
  std::vector<int32_t> first_from(sets.size() + 1, 0);  // moves into t: from[first_from[t]...]
  for (int32_t target : moves_) ++first_from[static_cast<size_t>(target) + 1];
  for (size_t t = 0; t < sets.size(); ++t) first_from[t + 1] += first_from[t];
  std::vector<int32_t> from(moves_.size());
  std::vector<int32_t> filled(first_from.begin(), first_from.end() - 1);
  for (size_t move = 0; move < moves_.size(); ++move)
    from[static_cast<size_t>(filled[static_cast<size_t>(moves_[move])]++)] =
        static_cast<int32_t>(move / classes_);
  std::vector<int32_t> pending;
  for (size_t state = 0; state < sets.size(); ++state)
    if (live[state]) pending.push_back(static_cast<int32_t>(state));
  while (!pending.empty()) {
    const auto target = static_cast<size_t>(pending.back());
    pending.pop_back();
    for (int32_t i = first_from[target]; i < first_from[target + 1]; ++i) {
      const auto source = static_cast<size_t>(from[static_cast<size_t>(i)]);
      if (!live[source]) {
        live[source] = 1;
        pending.push_back(static_cast<int32_t>(source));
      }
    }
  }
  if (!live[kStart]) throw GrammarError("regex: the pattern matches no string");
  for (int32_t& target : moves_)
    if (!live[static_cast<size_t>(target)]) target = kDead;
  for (size_t state = 0; state < sets.size(); ++state) {
    bool moves = false;
    for (size_t c = 0; c < classes_; ++c) moves = moves || moves_[state * classes_ + c] != kDead;
    final_[state] = !moves;
  }
  const size_t bytes = byte_class_.size() + moves_.size() * sizeof(int32_t) + accepting_.size();
  std::vector<uint8_t> image;
  image.reserve(bytes);
  image.insert(image.end(), byte_class_.begin(), byte_class_.end());
  const auto* moves = reinterpret_cast<const uint8_t*>(moves_.data());
  image.insert(image.end(), moves, moves + moves_.size() * sizeof(int32_t));
  image.insert(image.end(), accepting_.begin(), accepting_.end());
  const XXH128_hash_t hash = XXH3_128bits(image.data(), image.size());
  fingerprint_ = {hash.low64, hash.high64};
}

}  // namespace deepinfer::structured

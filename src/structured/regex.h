// Regular expressions as byte-level automata for constrained output: the ECMAScript/PCRE
// subset that schemas and users write (literals, escapes, classes, '.', groups, alternation,
// bounded and unbounded quantifiers), matched against the whole output. A construct whose
// language we cannot enforce (look-around, back-references, word boundaries, anchors inside
// the pattern) is refused with its name, never ignored.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace deepinfer::structured {

// A pattern or grammar the engine refuses (bad syntax, an unsupported construct, too large).
class GrammarError : public Error {
 public:
  using Error::Error;
};

// The code points of `utf8`; false (and `out` partial) when it is not valid UTF-8.
bool decode_utf8(std::string_view utf8, std::vector<uint32_t>& out);

// Code point ranges sorted with overlapping and touching ones merged.
std::vector<std::pair<uint32_t, uint32_t>> normalised_code_points(
    std::vector<std::pair<uint32_t, uint32_t>> ranges);
// Every code point (surrogates excluded: UTF-8 cannot hold them) outside `ranges`.
std::vector<std::pair<uint32_t, uint32_t>> complement_code_points(
    const std::vector<std::pair<uint32_t, uint32_t>>& ranges);

// A regular language over Unicode code points, as a tree (RegexTree::parse or built directly).
struct RegexNode {
  enum class Kind : uint8_t { kEmpty, kChars, kConcat, kAlternation, kRepeat };
  Kind kind = Kind::kEmpty;
  std::vector<std::pair<uint32_t, uint32_t>> chars;  // kChars: sorted, disjoint code point ranges
  std::vector<int> children;                         // indices into RegexTree::nodes
  int min = 0, max = 0;                              // kRepeat; max < 0: unbounded
};

struct RegexTree {
  std::vector<RegexNode> nodes;
  int root = -1;

  // Limits that keep a hostile pattern from costing the server more than a small request.
  static constexpr size_t kMaxPatternBytes = 16 * 1024;
  static constexpr int kMaxRepeat = 1000;

  // Throws GrammarError naming the construct and its offset.
  static RegexTree parse(std::string_view pattern);
  // The texts in which `pattern` finds a match (ECMAScript search, as JSON Schema's "pattern"
  // means it): alternatives not anchored by '^' or '$' may have any text around them.
  static RegexTree parse_search(std::string_view pattern);
  // Exactly one of `choices` (vLLM's guided_choice).
  static RegexTree choice(const std::vector<std::string>& choices);

  int add(RegexNode node);
  int literal(std::string_view utf8);
};

// The tree as a deterministic automaton over bytes (UTF-8), built whole when compiled so that
// matching never allocates: states are ids, 0 is the dead state, 1 the start.
class ByteDfa {
 public:
  // Throws GrammarError when the automaton would exceed kMaxStates.
  explicit ByteDfa(const RegexTree& tree);
  static constexpr int kDead = 0;
  static constexpr int kStart = 1;
  static constexpr int kMaxStates = 50000;
  static constexpr size_t kMaxWork = 60'000'000;  // NFA states visited while building it
  static constexpr size_t kLookupWork = 8;
  int next(int state, uint8_t byte) const {
    return moves_[static_cast<size_t>(state) * classes_ + byte_class_[byte]];
  }
  bool accepting(int state) const { return accepting_[static_cast<size_t>(state)] != 0; }
  // No byte leads anywhere but the dead state: the match is over.
  bool final(int state) const { return final_[static_cast<size_t>(state)] != 0; }
  int size() const { return static_cast<int>(accepting_.size()); }
  // A 128-bit hash of the whole automaton: automata built from the same language the same way
  // share it (and so can share what is worked out from them).
  std::pair<uint64_t, uint64_t> fingerprint() const { return fingerprint_; }

 private:
  std::vector<uint8_t> byte_class_ = std::vector<uint8_t>(256, 0);
  size_t classes_ = 1;
  std::vector<int32_t> moves_;  // [state][class]
  std::vector<uint8_t> accepting_, final_;
  std::pair<uint64_t, uint64_t> fingerprint_{0, 0};
};

}  // namespace deepinfer::structured

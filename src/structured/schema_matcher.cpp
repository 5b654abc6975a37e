// JSON Schema constraints: a byte-level pushdown automaton over the SchemaGraph. Its state is
// a few threads (one per anyOf branch still possible), each a stack of frames: the containers
// open and the scalar being written, each with the schema node it must satisfy. The token
// mask walks the sorted vocabulary (token_walk.h).
#include <algorithm>
#include <boost/container/small_vector.hpp>
#include <cmath>
#include <cstdio>
#include <limits>

#include "structured/dfa_masks.h"
#include "structured/json_schema.h"
#include "structured/kept_masks.h"
#include "structured/program_constraint.h"
#include "structured/schema_numbers.h"
#include "structured/shared_stack.h"
#include "structured/structured.h"
#include "structured/token_walk.h"
#include "structured/utf8.h"

namespace deepinfer::structured {
namespace {

constexpr int kMaxWhitespaceRun = 48;
constexpr size_t kMaxKeyBytes = 4096;
constexpr size_t kMaxThreads = 64;
constexpr int kMaxUnionDepth = 32;
// Containers open at once: a recursive schema would otherwise let the output nest without end
// (and every mask's walk copies the top of the stack).
constexpr size_t kMaxNesting = 128;

bool is_space(uint8_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
bool is_digit(uint8_t c) {
  return c >= '0' && c <= '9';
}
bool is_hex(uint8_t c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

const SchemaNode& any_node() {
  static const SchemaNode any;
  return any;
}

enum class Mode : uint8_t {
  kValue,       // a value must start
  kLiteral,     // inside an enum / const value (automaton state in `state`)
  kString,      // inside a string (content automaton state in `state` when it has one)
  kNumber,      // inside a number (`number`)
  kWord,        // inside true / false / null (`word`, position in `count`)
  kArrayOpen,   // after '[': an item or ']'
  kArrayNext,   // after an item: ',' or ']'
  kArrayItem,   // after ',': an item
  kObjectOpen,  // after '{': a key or '}'
  kObjectKey,   // after ',': a key
  kKey,         // inside a key (its bytes in `key`, pattern automata states in `key_states`)
  kColon,       // after a key (its value's node in `pending`)
  kObjectNext,  // after a value: ',' or '}'
};

struct Frame {
  int node = -1;  // -1: any value
  Mode mode = Mode::kValue;
  uint8_t escape = 0;  // strings and keys: where in a character (Automaton::escape_byte)
  uint8_t word = 0;
  int32_t state = 0;
  int32_t excluded = ByteDfa::kStart;  // the node's excluded-values automaton over the value
  int32_t pending = -1;
  int64_t count = 0;  // string code points, array items, object properties, word position
  NumberReading number;
  std::vector<uint64_t> seen;  // declared properties present
  std::string key;
  std::vector<int32_t> key_states;
  bool operator==(const Frame&) const = default;
};

Frame value_frame(int node) {
  Frame frame;
  frame.node = node;
  return frame;
}

struct Thread {
  SharedStack<Frame> stack;  // empty: the value is complete
  uint8_t spaces = 0;
  bool operator==(const Thread&) const = default;
};

// Most automata hold one thread: kept inline, a copy (which a mask's walk makes for every byte
// it tries) allocates nothing for the list.
using Threads = boost::container::small_vector<Thread, 2>;

constexpr const char* kWords[] = {"true", "false", "null"};

enum class Result : uint8_t { kReject, kAccept, kRedo };

class Automaton {
 public:
  explicit Automaton(const SchemaGraph* graph) : graph_(graph) {
    Thread start;
    start.stack.push_back(value_frame(graph->root));
    threads_.push_back(std::move(start));
  }
  Automaton(const SchemaGraph* graph, Threads threads)
      : graph_(graph), threads_(std::move(threads)) {}

  // Steps every thread on `c`. The threads are moved through, not copied: after false the
  // automaton is spent (callers feed a copy they drop on failure).
  bool feed(uint8_t c) {
    if (threads_.size() == 1) {  // the common case, stepped in place
      const Result result = step_rounds(threads_.front(), c);
      if (result == Result::kAccept) return true;
      if (result == Result::kReject) {
        threads_.clear();
        return false;
      }
    }
    Threads next;
    for (Thread& thread : threads_) step_thread(std::move(thread), c, next);
    threads_ = std::move(next);
    return !threads_.empty();
  }

  bool complete() const {
    return std::any_of(threads_.begin(), threads_.end(), [&](const Thread& thread) {
      if (thread.stack.empty()) return true;
      // A number (or a numeric enum value) at the top level ends with the output.
      const Frame& top = thread.stack.back();
      if (thread.stack.size() != 1) return false;
      if (top.mode == Mode::kLiteral)
        return automaton(node(top.node).literals).accepting(top.state);
      return top.mode == Mode::kNumber && number_can_end(node(top.node), top.number) &&
             !excluded_now(top);
    });
  }

  // The string being written, when there is one thread and it is inside a string's plain
  // content: tokens without '"', '\\' or control bytes then only extend it.
  // The state as bytes, leaving out what cannot change what follows (an unbounded number's
  // value, a count past every bound on it): two automata with the same key allow the same
  // tokens, and a document's many numbers and long strings reach the same keys again.
  std::string key() const {
    std::string out;
    auto put = [&](const auto& value) {
      out.append(reinterpret_cast<const char*>(&value), sizeof(value));
    };
    auto put_exact = [&](long double value) {  // as hex digits: padding bytes carry nothing
      char text[64];
      const int length = std::snprintf(text, sizeof(text), "%La", value);
      out.append(text, static_cast<size_t>(length));
      out.push_back('|');
    };
    for (const Thread& thread : threads_) {
      put(thread.spaces);
      put(thread.stack.size());
      thread.stack.each([&](const Frame& frame) {
        put(frame.node), put(frame.mode), put(frame.escape), put(frame.word), put(frame.state);
        put(frame.excluded), put(frame.pending), put(key_count(frame));
        const NumberReading& r = frame.number;
        put(r.part), put(r.negative);
        if (frame.mode == Mode::kNumber && bounded(node(frame.node))) {
          put(r.int_digits), put(r.frac_digits);
          put_exact(r.int_value);
          put_exact(r.frac_value);
        }
        put(frame.seen.size());
        for (uint64_t word : frame.seen) put(word);
        put(frame.key.size());
        out += frame.key;
        put(frame.key_states.size());
        for (int32_t state : frame.key_states) put(state);
      });
      out.push_back('#');
    }
    return out;
  }

  // What of a frame's count can change what follows: all of it where a maximum counts it
  // down, or in a word; elsewhere only up to the largest minimum (or prefixItems) it meets.
  int64_t key_count(const Frame& frame) const {
    const SchemaNode& n = node(frame.node);
    auto capped = [&](int64_t maximum, int64_t floor) {
      return maximum >= 0 ? frame.count : std::min(frame.count, floor);
    };
    switch (frame.mode) {
      case Mode::kString:
        return capped(n.max_length, n.min_length);
      case Mode::kArrayOpen:
      case Mode::kArrayNext:
      case Mode::kArrayItem:
        return capped(n.max_items,
                      std::max(n.min_items, static_cast<int64_t>(n.prefix_items.size())));
      case Mode::kObjectOpen:
      case Mode::kObjectKey:
      case Mode::kKey:
      case Mode::kColon:
      case Mode::kObjectNext:
        return capped(n.max_properties, n.min_properties);
      default:
        return frame.count;
    }
  }

  // The frames being written when every thread is inside a string's plain content or a key's
  // plain content of an object that takes any key (a plain token then only extends each, up to
  // kMaxKeyBytes for keys); empty otherwise.
  std::vector<const Frame*> plain_tops() const {
    std::vector<const Frame*> tops;
    for (const Thread& thread : threads_) {
      if (thread.stack.empty()) return {};
      const Frame& top = thread.stack.back();
      const bool plain =
          top.escape == 0 &&
          (top.mode == Mode::kString || (top.mode == Mode::kKey && node(top.node).more_properties));
      if (!plain) return {};
      tops.push_back(&top);
    }
    return tops;
  }
  static bool is_key(const Frame& frame) { return frame.mode == Mode::kKey; }
  static constexpr size_t max_key_bytes() { return kMaxKeyBytes; }
  size_t threads() const { return threads_.size(); }
  // This automaton with only its thread `index`: the tokens a set of threads takes are those
  // any one of them takes.
  Automaton only(size_t index) const {
    Automaton one(graph_, Threads{});
    one.threads_.push_back(threads_[index]);
    return one;
  }

  const SchemaNode& node(int index) const {
    return index < 0 ? any_node() : graph_->nodes[static_cast<size_t>(index)];
  }

 private:
  const ByteDfa& automaton(int index) const {
    return *graph_->automata[static_cast<size_t>(index)];
  }

  // Feeds `c` to a thread; a value that starts at a union forks one thread per branch. A step
  // that hands the byte on (a number or enum value it ends, an item it starts) feeds it again.
  // Steps `thread` on `c` in place until it takes or refuses the byte; kRedo: it stopped at a
  // union's value, whose branches step_thread follows one by one.
  Result step_rounds(Thread& thread, uint8_t c) const {
    for (int round = 0; round < 8 && !thread.stack.empty(); ++round) {
      const Frame& top = thread.stack.back();
      if (top.mode == Mode::kValue && !is_space(c) && !node(top.node).any_of.empty())
        return Result::kRedo;
      const Result result = step(thread, c);
      if (result != Result::kRedo) return result;
    }
    return Result::kReject;
  }

  void step_thread(Thread thread, uint8_t c, Threads& out) const {
    switch (step_rounds(thread, c)) {
      case Result::kReject:
        return;
      case Result::kAccept:
        add(std::move(thread), out);
        return;
      case Result::kRedo:
        break;
    }
    std::vector<int> leaves;
    union_leaves(thread.stack.back().node, 0, leaves);
    for (int leaf : leaves) {
      Thread branch = thread;
      branch.stack.back().node = leaf;
      step_thread(std::move(branch), c, out);
    }
  }

  void union_leaves(int index, int depth, std::vector<int>& leaves) const {
    if (depth > kMaxUnionDepth) return;
    const SchemaNode& n = node(index);
    if (n.any_of.empty()) {
      if (std::find(leaves.begin(), leaves.end(), index) == leaves.end()) leaves.push_back(index);
      return;
    }
    for (int option : n.any_of) union_leaves(option, depth + 1, leaves);
  }

  static void add(Thread thread, Threads& out) {
    if (out.size() >= kMaxThreads) return;
    if (std::find(out.begin(), out.end(), thread) == out.end()) out.push_back(std::move(thread));
  }

  // Whitespace between a container's parts (and before the value), in runs of at most
  // kMaxWhitespaceRun.
  static bool takes_space(Mode mode) {
    return mode != Mode::kLiteral && mode != Mode::kString && mode != Mode::kNumber &&
           mode != Mode::kWord && mode != Mode::kKey;
  }

  static Result accepted(bool ok) { return ok ? Result::kAccept : Result::kReject; }

  Result step(Thread& thread, uint8_t c) const {
    Frame& top = thread.stack.back();
    if (is_space(c) && takes_space(top.mode)) return accepted(++thread.spaces <= kMaxWhitespaceRun);
    if (top.mode == Mode::kNumber && !number_continues(node(top.node), top.number, c)) {
      if (!number_can_end(node(top.node), top.number) || excluded_now(top)) return Result::kReject;
      thread.stack.pop_back();  // the byte after the number belongs to its container
      return Result::kRedo;
    }
    if (top.mode == Mode::kLiteral &&
        automaton(node(top.node).literals).next(top.state, c) == ByteDfa::kDead) {
      if (!automaton(node(top.node).literals).accepting(top.state)) return Result::kReject;
      thread.stack.pop_back();
      return Result::kRedo;
    }
    thread.spaces = 0;
    const int excluded = node(top.node).excluded;
    if (excluded >= 0 && (top.mode == Mode::kString || top.mode == Mode::kNumber ||
                          top.mode == Mode::kWord || top.mode == Mode::kValue))
      top.excluded = automaton(excluded).next(top.excluded, c);
    switch (top.mode) {
      case Mode::kValue:
        return accepted(start_value(thread, c));
      case Mode::kLiteral: {
        const ByteDfa& literals = automaton(node(top.node).literals);
        top.state = literals.next(top.state, c);
        if (literals.final(top.state)) thread.stack.pop_back();  // nothing can extend it
        return Result::kAccept;
      }
      case Mode::kString:
        return accepted(string_byte(thread, c));
      case Mode::kNumber:
        return accepted(number_take(node(top.node), top.number, c));
      case Mode::kWord:
        if (c != static_cast<uint8_t>(kWords[top.word][top.count])) return Result::kReject;
        if (kWords[top.word][++top.count] != '\0') return Result::kAccept;
        if (excluded_now(top)) return Result::kReject;
        thread.stack.pop_back();
        return Result::kAccept;
      case Mode::kArrayOpen:
      case Mode::kArrayNext:
      case Mode::kArrayItem:
        return array_byte(thread, c);
      default:
        return object_byte(thread, c);
    }
  }

  bool start_value(Thread& thread, uint8_t c) const {
    Frame& top = thread.stack.back();
    const SchemaNode& n = node(top.node);
    if (n.literals >= 0) {
      const ByteDfa& literals = automaton(n.literals);
      top.state = literals.next(ByteDfa::kStart, c);
      top.mode = Mode::kLiteral;
      if (top.state == ByteDfa::kDead) return false;
      if (literals.final(top.state)) thread.stack.pop_back();
      return true;
    }
    if ((c == '{' || c == '[') && thread.stack.size() > kMaxNesting) return false;
    if (c == '{' && (n.types & kObjectType)) {
      top.mode = Mode::kObjectOpen;
      top.seen.assign((n.properties.size() + 63) / 64, 0);
      return true;
    }
    if (c == '[' && (n.types & kArrayType)) {
      top.mode = Mode::kArrayOpen;
      return true;
    }
    if (c == '"' && (n.types & kStringType)) {
      top.mode = Mode::kString;
      top.state = ByteDfa::kStart;
      return true;
    }
    if ((c == '-' || is_digit(c)) && (n.types & (kIntegerType | kNumberType))) {
      top.mode = Mode::kNumber;
      top.number.negative = c == '-';
      top.number.part = NumberPart::kMinus;
      return c == '-' ? number_feasible(n, top.number) : number_take(n, top.number, c);
    }
    const int word = c == 't' ? 0 : c == 'f' ? 1 : c == 'n' ? 2 : -1;
    if (word < 0 || !(n.types & (word == 2 ? kNullType : kBooleanType))) return false;
    top.mode = Mode::kWord;
    top.word = static_cast<uint8_t>(word);
    top.count = 1;
    return true;
  }

  // The scalar written so far is one of the node's excluded values.
  bool excluded_now(const Frame& frame) const {
    const int excluded = node(frame.node).excluded;
    return excluded >= 0 && automaton(excluded).accepting(frame.excluded);
  }

  // Strings: the escape state (for counting code points), the length bounds and the content
  // automaton (which sees the bytes as written, escapes included).
  bool string_byte(Thread& thread, uint8_t c) const {
    Frame& top = thread.stack.back();
    const SchemaNode& n = node(top.node);
    if (top.escape == 0 && c == '"') {
      if (top.count < n.min_length || excluded_now(top)) return false;
      if (n.content >= 0 && !automaton(n.content).accepting(top.state)) return false;
      thread.stack.pop_back();
      return true;
    }
    const bool starts = top.escape == 0 && (c & 0xC0) != 0x80;  // an escape is one code point
    if (!escape_byte(top.escape, c)) return false;
    if (starts && ++top.count > n.max_length && n.max_length >= 0) return false;
    if (n.content < 0) return true;
    top.state = automaton(n.content).next(top.state, c);
    return top.state != ByteDfa::kDead;
  }

  // JSON string syntax (UTF-8 text): whether `c` may come after `escape` (0 between
  // characters, 1 after '\\', 2-5 with hex digits of \\u to come (+1), kUtf8 + s inside a
  // multi-byte character, utf8_next's state s); moves `escape` on.
  static constexpr uint8_t kUtf8 = 8;
  static bool escape_byte(uint8_t& escape, uint8_t c) {
    if (escape == 0 || escape >= kUtf8) {
      if (escape == 0 && c < 0x80) {
        if (c < 0x20) return false;
        if (c == '\\') escape = 1;
        return true;
      }
      const int next = utf8_next(escape == 0 ? 0 : escape - kUtf8, c);
      if (next < 0) return false;
      escape = next == 0 ? 0 : static_cast<uint8_t>(kUtf8 + next);
      return true;
    }
    if (escape == 1) {
      if (c == 'u') {
        escape = 5;
        return true;
      }
      escape = 0;
      return std::string_view("\"\\/bfnrt").find(static_cast<char>(c)) != std::string_view::npos;
    }
    if (!is_hex(c)) return false;
    escape = escape == 2 ? 0 : escape - 1;
    return true;
  }

  static bool item_allowed(const SchemaNode& n, int64_t index) {
    if (n.max_items >= 0 && index >= n.max_items) return false;
    return index < static_cast<int64_t>(n.prefix_items.size()) || n.more_items;
  }

  Result array_byte(Thread& thread, uint8_t c) const {
    Frame& top = thread.stack.back();
    const SchemaNode& n = node(top.node);
    if (c == ']' && top.mode != Mode::kArrayItem) {
      if (top.count < n.min_items) return Result::kReject;
      thread.stack.pop_back();
      return Result::kAccept;
    }
    if (top.mode == Mode::kArrayNext) {
      if (c != ',' || !item_allowed(n, top.count)) return Result::kReject;
      top.mode = Mode::kArrayItem;
      return Result::kAccept;
    }
    // An item starts with this byte.
    if (!item_allowed(n, top.count)) return Result::kReject;
    const int child = top.count < static_cast<int64_t>(n.prefix_items.size())
                          ? n.prefix_items[static_cast<size_t>(top.count)]
                          : n.items;
    ++top.count;
    top.mode = Mode::kArrayNext;
    thread.stack.push_back(value_frame(child));
    return Result::kRedo;
  }

  // Objects: keys are matched against the declared names not yet present (sorted, so a
  // prefix search), the patternProperties automata, and additionalProperties.
  static bool seen(const Frame& frame, size_t property) {
    return (frame.seen[property / 64] >> (property % 64)) & 1;
  }

  static bool closable(const Frame& frame, const SchemaNode& n) {
    if (frame.count < n.min_properties) return false;
    for (size_t i = 0; i < n.properties.size(); ++i)
      if (n.properties[i].required && !seen(frame, i)) return false;
    auto all_seen = [&](const std::vector<size_t>& set) {
      return std::all_of(set.begin(), set.end(), [&](size_t i) { return seen(frame, i); });
    };
    for (const auto& [trigger, needed] : n.dependent_required)
      if (seen(frame, trigger) && !all_seen(needed)) return false;
    return std::none_of(n.not_all_present.begin(), n.not_all_present.end(), all_seen);
  }

  static bool new_key_possible(const Frame& frame, const SchemaNode& n) {
    if (n.max_properties >= 0 && frame.count >= n.max_properties) return false;
    if (n.more_properties || !n.pattern_properties.empty()) return true;
    for (size_t i = 0; i < n.properties.size(); ++i)
      if (!seen(frame, i)) return true;
    return false;
  }

  static size_t first_named(const SchemaNode& n, const std::string& key) {
    return static_cast<size_t>(std::lower_bound(n.properties.begin(), n.properties.end(), key,
                                                [](const SchemaNode::Property& p,
                                                   const std::string& k) { return p.name < k; }) -
                               n.properties.begin());
  }

  // Keys are matched as written, so each is written one way (as JSON text writes names):
  // characters as themselves, escapes only where JSON needs them ("\\/" and "\\u" for a
  // printable character would name a declared property without matching it).
  static bool canonical_key_byte(uint8_t escape, uint8_t c) {
    if (escape == 1) return c != '/';
    if (escape == 5 || escape == 4) return c == '0';  // \u00..
    if (escape == 3) return c == '0' || c == '1';     // control characters only
    return true;
  }

  bool key_byte(Frame& frame, const SchemaNode& n, uint8_t c) const {
    if (!canonical_key_byte(frame.escape, c) || !escape_byte(frame.escape, c) ||
        frame.key.size() >= kMaxKeyBytes)
      return false;
    frame.key.push_back(static_cast<char>(c));
    bool alive = n.more_properties;
    for (size_t i = 0; i < frame.key_states.size(); ++i) {
      int32_t& state = frame.key_states[i];
      if (state != ByteDfa::kDead) state = automaton(n.pattern_properties[i].first).next(state, c);
      alive = alive || state != ByteDfa::kDead;
    }
    for (size_t i = first_named(n, frame.key);
         !alive && i < n.properties.size() && n.properties[i].name.starts_with(frame.key); ++i)
      alive = !seen(frame, i);
    return alive;
  }

  bool close_key(Frame& frame, const SchemaNode& n) const {
    const size_t named = first_named(n, frame.key);
    if (named < n.properties.size() && n.properties[named].name == frame.key) {
      if (seen(frame, named)) return false;
      frame.seen[named / 64] |= uint64_t{1} << (named % 64);
      frame.pending = n.properties[named].node;
    } else {
      int matches = 0;
      for (size_t i = 0; i < frame.key_states.size(); ++i) {
        const int32_t state = frame.key_states[i];
        if (state == ByteDfa::kDead || !automaton(n.pattern_properties[i].first).accepting(state))
          continue;
        ++matches;
        frame.pending = n.pattern_properties[i].second;
      }
      // A key two patterns match must satisfy both, which one node cannot say: not written.
      if (matches > 1 || (matches == 0 && !n.more_properties)) return false;
      if (matches == 0) frame.pending = n.additional;
    }
    frame.mode = Mode::kColon;
    return true;
  }

  Result object_byte(Thread& thread, uint8_t c) const {
    Frame& top = thread.stack.back();
    const SchemaNode& n = node(top.node);
    switch (top.mode) {
      case Mode::kObjectOpen:
      case Mode::kObjectNext:
        if (c == '}') {
          if (!closable(top, n)) return Result::kReject;
          thread.stack.pop_back();
          return Result::kAccept;
        }
        if (top.mode == Mode::kObjectNext) {
          if (c != ',' || !new_key_possible(top, n)) return Result::kReject;
          top.mode = Mode::kObjectKey;
          return Result::kAccept;
        }
        [[fallthrough]];
      case Mode::kObjectKey:
        if (c != '"' || !new_key_possible(top, n)) return Result::kReject;
        top.mode = Mode::kKey;
        top.key.clear();
        top.escape = 0;
        top.key_states.assign(n.pattern_properties.size(), ByteDfa::kStart);
        return Result::kAccept;
      case Mode::kKey:
        if (top.escape == 0 && c == '"')
          return close_key(top, n) ? Result::kAccept : Result::kReject;
        return key_byte(top, n, c) ? Result::kAccept : Result::kReject;
      case Mode::kColon: {
        if (c != ':') return Result::kReject;
        const int child = top.pending;
        top.mode = Mode::kObjectNext;
        ++top.count;
        thread.stack.push_back(value_frame(child));
        return Result::kAccept;
      }
      default:
        return Result::kReject;
    }
  }

  const SchemaGraph* graph_;
  Threads threads_;
};

struct SchemaProgram {
  using Fits = TokenTable::Bits;

  SchemaProgram(SchemaGraph compiled, std::shared_ptr<const TokenTable> tokens)
      : graph(std::move(compiled)), table(std::move(tokens)) {}

  // Which string_plain tokens (bits by token id) content automaton `index` takes whole from
  // `state`: worked out on first use and kept by the vocabulary's table.
  Fits plain_fits(int index, int state) const {
    const ByteDfa& dfa = *graph.automata[static_cast<size_t>(index)];
    const auto [low, high] = dfa.fingerprint();
    return table->shared_bits({low, high, static_cast<uint64_t>(state), DfaMasks::kPlainFits}, [&] {
      std::vector<uint64_t> made((static_cast<size_t>(table->size()) + 63) / 64, 0);
      allow_dfa_tokens(dfa, state, *table, table->string_plain_sorted(), made);
      return made;
    });
  }

  using Mask = std::shared_ptr<const std::vector<uint64_t>>;
  static constexpr size_t kMaxMasks = 256;  // 19 KB each for a 151k vocabulary

  // One thread's mask (end tokens aside) and the thread steps its walk took: it is what any
  // walk of that thread given at least that budget finds.
  struct ThreadMask {
    Mask bits;
    size_t steps = 0;
  };

  SchemaGraph graph;
  std::shared_ptr<const TokenTable> table;
  mutable KeptMasks<std::string, Mask> masks{kMaxMasks};  // by Automaton::key
  // By the key of an Automaton::only the thread.
  mutable KeptMasks<std::string, ThreadMask> thread_masks{kMaxMasks};
};

class SchemaMatcher final : public Matcher {
 public:
  explicit SchemaMatcher(std::shared_ptr<const SchemaProgram> program)
      : program_(std::move(program)), automaton_(&program_->graph) {}

  std::unique_ptr<Matcher> clone() const override { return std::make_unique<SchemaMatcher>(*this); }

  // A state's mask is kept by the program: requests of one schema pass through the same
  // states (the start, each key, each value's start) again and again.
  TokenMask allowed() const override {
    const std::string key = automaton_.key();
    SchemaProgram::Mask mask = program_->masks.find(key).value_or(nullptr);
    if (!mask) {
      mask = std::make_shared<const std::vector<uint64_t>>(allowed_tokens());
      program_->masks.keep(key, mask);
    }
    return {std::move(mask), program_->table->size()};
  }
  bool accept(int32_t token) override {
    const TokenTable& table = *program_->table;
    if (token < 0 || token >= table.size()) return false;
    if (table.is_end(token)) return complete();
    const std::string& bytes = table.bytes(token);
    if (bytes.empty()) return false;
    Automaton next = automaton_;
    for (char c : bytes)
      if (!next.feed(static_cast<uint8_t>(c))) return false;
    automaton_ = std::move(next);
    return true;
  }

  bool complete() const override { return automaton_.complete(); }

 private:
  // Inside a string, a plain token fits when its code points stay within maxLength and the
  // content automaton (pattern, format) takes its bytes: no walk of the automaton over them.
  void allow_plain_string_tokens(const Frame& string, std::vector<uint64_t>& allowed) const {
    const SchemaNode& n = automaton_.node(string.node);
    const int64_t room =
        n.max_length < 0 ? std::numeric_limits<int64_t>::max() : n.max_length - string.count;
    const SchemaProgram::Fits fits =
        n.content >= 0 ? program_->plain_fits(n.content, string.state) : nullptr;
    program_->table->allow_string_plain(room, std::numeric_limits<int64_t>::max(), fits.get(),
                                        allowed);
  }

  // A mask's walk steps at most this many threads by a byte (at most about 80 ms), shared out
  // evenly between the automaton's threads: past its share a thread's walk allows only the
  // tokens already checked, and the mask then adds the single bytes, so a schema whose unions
  // keep many threads alive writes in smaller tokens instead of stalling.
  static constexpr size_t kMaxThreadSteps = 300'000;

  // The automaton, charging each byte it is fed to a budget; out of budget, it takes nothing.
  struct Budgeted {
    Automaton automaton;
    size_t* spent;
    size_t budget;
    bool feed(uint8_t c) {
      if (*spent > budget) return false;
      *spent += automaton.threads();
      return automaton.feed(c);
    }
  };

  std::vector<uint64_t> allowed_tokens() const {
    const TokenTable& table = *program_->table;
    std::vector<uint64_t> allowed((static_cast<size_t>(table.size()) + 63) / 64, 0);
    if (automaton_.complete())
      for (int32_t id : table.end_tokens()) mark(allowed, id);
    bool cut = false;
    size_t steps = 0;
    if (automaton_.threads() == 1) {
      cut = !allow_thread_tokens(automaton_, kMaxThreadSteps, allowed, steps);
    } else {
      // Thread by thread: most are inside a string or key, whose plain tokens are a table
      // lookup, and a thread's mask recurs in other unions' states. A thread's mask depends
      // only on the thread and its share of the budget, whatever was kept before.
      const size_t share = kMaxThreadSteps / automaton_.threads();
      for (size_t t = 0; t < automaton_.threads(); ++t) {
        const Automaton one = automaton_.only(t);
        const std::string key = one.key();
        const auto kept = program_->thread_masks.find(key);
        if (kept && kept->steps <= share) {
          or_into(allowed, *kept->bits);
          continue;
        }
        std::vector<uint64_t> bits(allowed.size(), 0);
        steps = 0;
        const bool whole = allow_thread_tokens(one, share, bits, steps);
        or_into(allowed, bits);
        if (whole) {
          program_->thread_masks.keep(
              key, {std::make_shared<const std::vector<uint64_t>>(std::move(bits)), steps});
        } else {
          cut = true;
        }
      }
    }
    if (cut) allow_fed_tokens(automaton_, table, table.one_byte_tokens(), allowed);
    return allowed;
  }

  static void or_into(std::vector<uint64_t>& allowed, const std::vector<uint64_t>& bits) {
    for (size_t w = 0; w < allowed.size(); ++w) allowed[w] |= bits[w];
  }

  // Marks the tokens `automaton` takes (end tokens aside), counting in `spent` the thread
  // steps its walk takes; false when they exceed `budget` (the walk was cut short: a walk
  // whose steps stay within a budget is the same under any larger one).
  bool allow_thread_tokens(const Automaton& automaton, size_t budget,
                           std::vector<uint64_t>& allowed, size_t& spent) const {
    const TokenTable& table = *program_->table;
    const Budgeted start{automaton, &spent, budget};
    if (const std::vector<const Frame*> tops = automaton.plain_tops(); !tops.empty()) {
      for (const Frame* top : tops) {
        if (Automaton::is_key(*top)) {
          table.allow_string_plain(
              std::numeric_limits<int64_t>::max(),
              static_cast<int64_t>(Automaton::max_key_bytes() - top->key.size()), nullptr, allowed);
        } else {
          allow_plain_string_tokens(*top, allowed);
        }
      }
      allow_fed_tokens(start, table, table.string_sensitive(), allowed);
    } else {
      allow_fed_tokens(start, table, table.sorted(), allowed);
    }
    return spent <= budget;
  }

  std::shared_ptr<const SchemaProgram> program_;
  Automaton automaton_;
};

using SchemaConstraint = ProgramConstraint<SchemaMatcher, SchemaProgram>;

}  // namespace

std::shared_ptr<const Constraint> json_schema_constraint(std::shared_ptr<const TokenTable> table,
                                                         std::string_view schema_json) {
  return std::make_shared<SchemaConstraint>(
      std::make_shared<SchemaProgram>(SchemaGraph::compile(schema_json), std::move(table)));
}

}  // namespace deepinfer::structured

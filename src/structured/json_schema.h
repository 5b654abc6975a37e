// JSON Schema as the structured module sees it: a graph of value shapes compiled from a
// schema (drafts 2020-12 and 7), which the schema matcher walks byte by byte. Every keyword
// either narrows a shape or is refused with a GrammarError that names it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "structured/regex.h"

namespace deepinfer::structured {

// JSON value types as bits of SchemaNode::types.
enum JsonType : uint8_t {
  kNullType = 1,
  kBooleanType = 2,
  kIntegerType = 4,
  kNumberType = 8,  // any number, integers included
  kStringType = 16,
  kArrayType = 32,
  kObjectType = 64,
  kAnyType = 127,
};

// A numeric bound: value and whether it is exclusive.
struct NumberBound {
  double value = 0.0;
  bool exclusive = false;
};

// One value's shape. Nodes refer to each other by index into SchemaGraph::nodes, so $ref
// cycles are plain edges.
struct SchemaNode {
  // A union (anyOf, oneOf, type lists over different shapes): the value takes the shape of
  // one of these nodes; the fields below are then unused.
  std::vector<int> any_of;
  bool exclusive = false;  // oneOf: the branches were shown to share no value
  uint8_t types = kAnyType;
  // enum / const: the value is one of these texts (compact JSON) and nothing else.
  int literals = -1;  // index into SchemaGraph::automata
  // not enum / const: the scalar value may not be written as any of these texts (every JSON
  // spelling of each excluded value).
  int excluded = -1;
  // Numbers (kIntegerType, kNumberType).
  std::optional<NumberBound> minimum, maximum;
  int64_t multiple_of = 0;  // integers only; 0: none
  // Strings.
  int64_t min_length = 0, max_length = -1;  // code points; -1: unbounded
  int content = -1;  // pattern / format: the automaton over the string's JSON-escaped bytes
  // Arrays.
  std::vector<int> prefix_items;
  int items = -1;          // the shape of items after the prefix; -1: any value
  bool more_items = true;  // false: no items after the prefix
  int64_t min_items = 0, max_items = -1;
  // Objects. properties are sorted by name (JSON-escaped, as the output writes it).
  struct Property {
    std::string name;
    int node = -1;
    bool required = false;
  };
  std::vector<Property> properties;
  std::vector<std::pair<int, int>> pattern_properties;  // (key automaton, node)
  int additional = -1;          // the shape of other keys' values; -1: any value
  bool more_properties = true;  // false: no keys but the declared and patterned ones
  int64_t min_properties = 0, max_properties = -1;
  // not required: sets of properties (indices into `properties`) that may not all be present.
  std::vector<std::vector<size_t>> not_all_present;
  // dependentRequired: when the first property is present, so must the others be.
  std::vector<std::pair<size_t, std::vector<size_t>>> dependent_required;
};

struct SchemaGraph {
  std::vector<SchemaNode> nodes;
  std::vector<std::unique_ptr<ByteDfa>> automata;
  int root = 0;

  // Limits that keep a hostile schema from costing the server more than a small request.
  static constexpr size_t kMaxSchemaBytes = 512 * 1024;
  static constexpr size_t kMaxNodes = 20000;
  static constexpr size_t kMaxAutomata = 2000;
  static constexpr int kMaxJsonDepth = 256;  // arrays and objects inside each other

  // Throws GrammarError naming the keyword (and its JSON pointer) it cannot enforce.
  static SchemaGraph compile(std::string_view schema_json);
};

// After compiling (schema_checks.cpp): each oneOf node (and where it is) shown to have branches
// that exclude each other, narrowing branches to the types where they do; and every union
// reaching a shape. Both throw GrammarError.
void settle_one_of(SchemaGraph& graph, const std::vector<std::pair<int, std::string>>& one_of);
void check_unions_end(const SchemaGraph& graph);

// The automaton of a string format's values ("date-time", "uuid", ...), or null for a format
// we do not know.
std::optional<RegexTree> format_language(std::string_view format);

// The most characters a format's values have beyond what its automaton bounds, if any.
std::optional<int64_t> format_max_length(std::string_view format);

// `tree`'s language as it is written inside a JSON string: '"', '\\' and control characters
// become their escapes.
RegexTree json_escaped(const RegexTree& tree);

// Every way JSON writes these strings (quotes included): each character as itself where
// allowed, as its short escape, or as \u escapes in either case of hex digits.
RegexTree json_spellings(const std::vector<std::string>& strings);

}  // namespace deepinfer::structured

// JSON Schema to SchemaGraph: each schema object becomes a node (a $ref the node of its
// target, so recursion is an edge back), allOf is merged into one schema first, and anyOf /
// oneOf become unions of nodes. Keywords that only annotate are skipped; any other keyword the
// graph cannot express is refused by name.
#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "structured/json_schema.h"
#include "structured/schema_merge.h"

namespace deepinfer::structured {
namespace {

uint8_t type_bit(const std::string& name, const std::string& pointer) {
  if (name == "null") return kNullType;
  if (name == "boolean") return kBooleanType;
  if (name == "integer") return kIntegerType;
  if (name == "number") return kNumberType | kIntegerType;
  if (name == "string") return kStringType;
  if (name == "array") return kArrayType;
  if (name == "object") return kObjectType;
  refuse(pointer, fmt::format("unknown type '{}'", name));
}

uint8_t types_of(const Json& type, const std::string& pointer) {
  if (type.is_string()) return type_bit(type.get<std::string>(), pointer);
  if (!type.is_array()) refuse(pointer, "'type' must be a string or an array");
  uint8_t bits = 0;
  for (const Json& one : type) {
    if (!one.is_string()) refuse(pointer, "'type' lists a non-string");
    bits |= type_bit(one.get<std::string>(), pointer);
  }
  return bits;
}

// The property name as the output writes it, between its quotes.
std::string escaped_name(const std::string& name) {
  const std::string quoted = Json(name).dump();
  return quoted.substr(1, quoted.size() - 2);
}

bool matches_whole(const ByteDfa& dfa, std::string_view text) {
  int state = ByteDfa::kStart;
  for (char c : text) {
    state = dfa.next(state, static_cast<uint8_t>(c));
    if (state == ByteDfa::kDead) return false;
  }
  return dfa.accepting(state);
}

class Compiler {
 public:
  explicit Compiler(const Json& document) : document_(document) {}

  SchemaGraph run() {
    graph_.root = node_for(document_, "#");
    settle_one_of(graph_, exclusive_);
    check_unions_end(graph_);
    return std::move(graph_);
  }

 private:
  int new_node() {
    if (graph_.nodes.size() >= SchemaGraph::kMaxNodes)
      throw GrammarError(
          fmt::format("json_schema: more than {} schema nodes", SchemaGraph::kMaxNodes));
    graph_.nodes.emplace_back();
    return static_cast<int>(graph_.nodes.size()) - 1;
  }

  int add_automaton(const RegexTree& tree) {
    if (graph_.automata.size() >= SchemaGraph::kMaxAutomata)
      throw GrammarError(fmt::format("json_schema: more than {} patterns, formats and enums",
                                     SchemaGraph::kMaxAutomata));
    graph_.automata.push_back(std::make_unique<ByteDfa>(tree));
    return static_cast<int>(graph_.automata.size()) - 1;
  }

  // The node of `schema`: made once per schema object, so that $ref cycles close.
  int node_for(const Json& schema, const std::string& pointer) {
    if (auto found = made_.find(&schema); found != made_.end()) return found->second;
    if (depth_ >= kMaxDepth)
      refuse(pointer, fmt::format("schemas nested deeper than {}", kMaxDepth));
    const int index = new_node();
    made_[&schema] = index;
    ++depth_;
    struct Leave {
      int& depth;
      ~Leave() { --depth; }
    } leave{depth_};
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) graph_.nodes[static_cast<size_t>(index)].types = 0;
      return index;
    }
    if (!schema.is_object()) refuse(pointer, "a schema must be an object or a boolean");
    fill(index, schema, pointer);
    return index;
  }

  // A schema made here (allOf merges, anyOf branches with their siblings): kept alive so that
  // node_for's addresses stay unique.
  const Json& keep(Json schema) {
    kept_.push_back(std::make_unique<Json>(std::move(schema)));
    return *kept_.back();
  }

  const Json& resolve(const std::string& ref, const std::string& pointer) {
    if (ref.empty() || ref[0] != '#') refuse(pointer, fmt::format("$ref '{}' is not local", ref));
    try {
      const Json& target = document_.at(Json::json_pointer(ref.substr(1)));
      return target;
    } catch (const Json::exception&) {
      refuse(pointer, fmt::format("$ref '{}' points at nothing", ref));
    }
  }

  void fill(int index, const Json& schema, const std::string& pointer) {
    if (schema.is_boolean()) {  // an allOf merged down to true or false
      if (!schema.get<bool>()) graph_.nodes[static_cast<size_t>(index)].types = 0;
      return;
    }
    if (schema.contains("$ref")) {
      if (!schema["$ref"].is_string()) refuse(pointer, "'$ref' must be a string");
      const Json& target = resolve(schema["$ref"].get<std::string>(), pointer);
      Json rest = schema;
      rest.erase("$ref");
      if (std::all_of(rest.items().begin(), rest.items().end(),
                      [](const auto& item) { return is_annotation(item.key()); })) {
        graph_.nodes[static_cast<size_t>(index)].any_of = {node_for(target, pointer + "/$ref")};
        return;
      }
      if (++ref_merges_ > 64) refuse(pointer, "$ref beside other keywords nests too deep");
      const Json& merged = keep(merge_schemas(expand_refs(target, pointer), rest, pointer));
      fill(index, merged, pointer);
      return;
    }
    if (schema.contains("allOf")) {
      Json merged = schema;
      merged.erase("allOf");
      if (!schema["allOf"].is_array()) refuse(pointer, "'allOf' must be an array");
      for (const Json& part : schema["allOf"])
        merged = merge_schemas(merged, expand_refs(part, pointer), pointer);
      fill(index, keep(std::move(merged)), pointer + "/allOf");
      return;
    }
    if (schema.contains("anyOf") || schema.contains("oneOf")) {
      fill_union(index, schema, pointer);
      return;
    }
    fill_plain(index, schema, pointer);
  }

  // A schema with $ref resolved at its top (for merging), a bounded number of times.
  Json expand_refs(const Json& schema, const std::string& pointer) {
    Json out = schema;
    for (int depth = 0; out.is_object() && out.contains("$ref"); ++depth) {
      if (depth > 16) refuse(pointer, "allOf over a $ref chain deeper than 16");
      const Json& target = resolve(out["$ref"].get<std::string>(), pointer);
      Json rest = out;
      rest.erase("$ref");
      out = rest.empty() ? target : merge_schemas(target, rest, pointer);
    }
    return out;
  }

  // anyOf / oneOf: each branch with the keywords beside it. oneOf is enforced as anyOf (at
  // least one branch matches).
  void fill_union(int index, const Json& schema, const std::string& pointer) {
    if (schema.contains("anyOf") && schema.contains("oneOf"))
      refuse(pointer, "anyOf beside oneOf is not supported");
    const char* key = schema.contains("anyOf") ? "anyOf" : "oneOf";
    const Json& branches = schema[key];
    if (!branches.is_array() || branches.empty())
      refuse(pointer, fmt::format("'{}' must be a non-empty array", key));
    Json siblings = schema;
    siblings.erase(key);
    const bool alone = std::all_of(siblings.items().begin(), siblings.items().end(),
                                   [](const auto& item) { return is_annotation(item.key()); });
    std::vector<int> options;
    for (size_t i = 0; i < branches.size(); ++i) {
      const std::string at = fmt::format("{}/{}/{}", pointer, key, i);
      if (alone) {
        options.push_back(node_for(branches[i], at));
      } else {
        const Json& merged = keep(merge_schemas(siblings, expand_refs(branches[i], at), at));
        options.push_back(node_for(merged, at));
      }
    }
    if (std::string_view(key) == "oneOf") exclusive_.emplace_back(index, pointer);
    graph_.nodes[static_cast<size_t>(index)].any_of = std::move(options);
  }

  // What a schema's "not" rules out.
  struct Negations {
    uint8_t types = 0;
    std::vector<Json> values;                        // enum / const
    std::vector<std::vector<std::string>> together;  // required
  };
  void fill_plain(int index, const Json& schema, const std::string& pointer);
  void negate(const Json& negated, const std::string& at, Negations& out);
  int excluded(const Json& values, uint8_t types, const std::string& pointer);
  void numbers(SchemaNode& node, const Json& schema, const std::string& pointer);
  void strings(SchemaNode& node, const Json& schema, const std::string& pointer);
  void arrays(int index, const Json& schema, const std::string& pointer);
  void objects(int index, const Json& schema, const std::string& pointer,
               const std::vector<std::vector<std::string>>& not_together);
  // Which properties may not all be present (not required) and which need others
  // (dependentRequired, draft 7's dependencies with arrays).
  struct PresenceRules {
    std::vector<std::vector<std::string>> not_together;
    std::vector<std::pair<std::string, std::vector<std::string>>> dependent;
  };
  void presence_rules(const PresenceRules& rules, bool open, int additional_node, bool patterned,
                      const std::string& pointer, std::vector<SchemaNode::Property>& properties,
                      SchemaNode& node);
  std::vector<std::pair<std::string, std::vector<std::string>>> dependencies(
      const Json& schema, const std::string& pointer);
  // The automaton of `values` (those of `types`, which becomes the types present).
  int literals(const Json& values, uint8_t& types, const std::string& pointer);

  const Json& document_;
  SchemaGraph graph_;
  std::map<const Json*, int> made_;
  std::vector<std::unique_ptr<Json>> kept_;
  std::vector<std::pair<int, std::string>> exclusive_;  // oneOf nodes and where they are
  int ref_merges_ = 0;
  static constexpr int kMaxDepth = 200;  // schema objects inside each other
  int depth_ = 0;
};

uint8_t type_of_value(const Json& value) {
  if (value.is_null()) return kNullType;
  if (value.is_boolean()) return kBooleanType;
  if (value.is_number_integer()) return kIntegerType;
  if (value.is_number())
    return std::trunc(value.get<double>()) == value.get<double>() ? kIntegerType : kNumberType;
  if (value.is_string()) return kStringType;
  return value.is_array() ? kArrayType : kObjectType;
}

// Assertions of the JSON Schema vocabularies the graph does not express. Keywords outside the
// vocabularies assert nothing (the specification has validators ignore them), as do
// annotations.
const std::set<std::string, std::less<>>& unsupported() {
  static const std::set<std::string, std::less<>> names = {
      "if",          "then",          "else",          "dependentSchemas",      "contains",
      "minContains", "maxContains",   "propertyNames", "unevaluatedProperties", "unevaluatedItems",
      "$dynamicRef", "$recursiveRef", "contentSchema"};
  return names;
}

void Compiler::fill_plain(int index, const Json& schema, const std::string& pointer) {
  for (const auto& [key, value] : schema.items())
    if (unsupported().count(key))
      refuse(pointer, fmt::format("keyword '{}' is not supported", key));
  if (schema.value("uniqueItems", false)) refuse(pointer, "keyword 'uniqueItems' is not supported");
  uint8_t types = schema.contains("type") ? types_of(schema["type"], pointer) : uint8_t{kAnyType};
  if (schema.value("nullable", false)) types |= kNullType;
  Negations negations;
  if (schema.contains("not")) negate(schema["not"], pointer + "/not", negations);
  types &= static_cast<uint8_t>(~negations.types);
  // "not integer" leaves non-integral numbers, which the number grammar cannot single out.
  if ((types & kNumberType) && !(types & kIntegerType))
    refuse(pointer + "/not", "'not' of integer under number is not supported");
  graph_.nodes[static_cast<size_t>(index)].types = types;
  if (schema.contains("enum") || schema.contains("const")) {
    Json values = schema.contains("const") ? Json::array({schema["const"]}) : schema["enum"];
    if (!values.is_array()) refuse(pointer, "'enum' must be an array");
    Json kept = Json::array();
    for (const Json& value : values)
      if (std::find(negations.values.begin(), negations.values.end(), value) ==
          negations.values.end())
        kept.push_back(value);
    const int automaton = literals(kept, types, pointer);
    graph_.nodes[static_cast<size_t>(index)].literals = automaton;
    graph_.nodes[static_cast<size_t>(index)].types = types;
    return;
  }
  numbers(graph_.nodes[static_cast<size_t>(index)], schema, pointer);
  strings(graph_.nodes[static_cast<size_t>(index)], schema, pointer);
  arrays(index, schema, pointer);
  objects(index, schema, pointer, negations.together);
  if (!negations.values.empty()) {
    const int automaton = excluded(negations.values, graph_.nodes[static_cast<size_t>(index)].types,
                                   pointer + "/not");
    graph_.nodes[static_cast<size_t>(index)].excluded = automaton;
  }
}

void Compiler::negate(const Json& negated, const std::string& at, Negations& out) {
  if (negated.is_boolean()) {  // not true: nothing; not false: anything
    if (negated.get<bool>()) out.types = kAnyType;
    return;
  }
  if (!negated.is_object()) refuse(at, "'not' must be a schema");
  std::vector<std::string> keys;
  for (const auto& [key, value] : negated.items())
    if (!is_annotation(key)) keys.push_back(key);
  if (keys.empty()) {  // not {}: nothing
    out.types = kAnyType;
    return;
  }
  if (keys.size() == 1 && keys[0] == "anyOf" && negated["anyOf"].is_array()) {
    // Not (A or B): not A and not B.
    for (size_t i = 0; i < negated["anyOf"].size(); ++i)
      negate(negated["anyOf"][i], fmt::format("{}/anyOf/{}", at, i), out);
    return;
  }
  if (keys.size() == 1 && keys[0] == "type") {
    out.types |= types_of(negated["type"], at);
  } else if (keys.size() == 1 && (keys[0] == "enum" || keys[0] == "const")) {
    const Json values = keys[0] == "const" ? Json::array({negated["const"]}) : negated["enum"];
    if (!values.is_array()) refuse(at, "'enum' must be an array");
    out.values.insert(out.values.end(), values.begin(), values.end());
  } else if (keys.size() == 1 && keys[0] == "required" && negated["required"].is_array()) {
    out.together.push_back(negated["required"].get<std::vector<std::string>>());
  } else {
    refuse(at, "'not' is supported over type, enum, const, required and anyOf of those");
  }
}

// The texts a value of `types` may not be: every spelling of each excluded scalar. A number
// has endless spellings (1, 1.0, 10e-1): excluded numbers need an integer-only node, where the
// only other spelling is -0.
int Compiler::excluded(const Json& values, uint8_t types, const std::string& pointer) {
  std::vector<std::string> strings, others;
  for (const Json& value : values) {
    const uint8_t type = type_of_value(value);
    if (!(types & type)) continue;  // a value of a type the node does not take anyway
    if (value.is_string()) {
      strings.push_back(value.get<std::string>());
    } else if (value.is_number()) {
      if (types & kNumberType) refuse(pointer, "'not' of a number under type number");
      const auto whole = static_cast<int64_t>(value.get<double>());
      others.push_back(std::to_string(whole));
      if (whole == 0) others.push_back("-0");
    } else if (value.is_boolean() || value.is_null()) {
      others.push_back(value.dump());
    } else {
      refuse(pointer, "'not' of an array or object value is not supported");
    }
  }
  if (strings.empty() && others.empty()) return -1;
  RegexTree tree = json_spellings(strings);
  std::vector<int> literal_nodes;
  for (const std::string& text : others) literal_nodes.push_back(tree.literal(text));
  RegexNode& root = tree.nodes[static_cast<size_t>(tree.root)];
  root.children.insert(root.children.end(), literal_nodes.begin(), literal_nodes.end());
  return add_automaton(tree);
}

int Compiler::literals(const Json& values, uint8_t& types, const std::string& pointer) {
  std::vector<std::string> texts;
  uint8_t present = 0;
  for (const Json& value : values) {
    const uint8_t type = type_of_value(value);
    if (!(types & type)) continue;
    texts.push_back(value.dump());
    present |= type;
  }
  types = present;
  if (texts.empty()) refuse(pointer, "no value of 'enum' or 'const' has an allowed type");
  return add_automaton(RegexTree::choice(texts));
}

double number_of(const Json& value, const std::string& pointer, const char* key) {
  if (!value.is_number()) refuse(pointer, fmt::format("'{}' must be a number", key));
  return value.get<double>();
}

void Compiler::numbers(SchemaNode& node, const Json& schema, const std::string& pointer) {
  auto bound = [&](const char* key, const char* exclusive_key) -> std::optional<NumberBound> {
    std::optional<NumberBound> out;
    if (schema.contains(key)) out = NumberBound{number_of(schema[key], pointer, key), false};
    if (schema.contains(exclusive_key)) {
      const Json& exclusive = schema[exclusive_key];
      if (exclusive.is_boolean()) {  // draft 4: a flag on the bound
        if (out) out->exclusive = exclusive.get<bool>();
      } else {
        const double value = number_of(exclusive, pointer, exclusive_key);
        const bool tighter = !out || (std::string_view(key) == "minimum" ? value >= out->value
                                                                         : value <= out->value);
        if (tighter) out = NumberBound{value, true};
      }
    }
    return out;
  };
  node.minimum = bound("minimum", "exclusiveMinimum");
  node.maximum = bound("maximum", "exclusiveMaximum");
  if (schema.contains("multipleOf")) {
    const double step = number_of(schema["multipleOf"], pointer, "multipleOf");
    if (step <= 0 || std::trunc(step) != step || step > 1e15)
      refuse(pointer, "'multipleOf' is supported for whole numbers only");
    node.multiple_of = static_cast<int64_t>(step);
    // Multiples of a whole number are integers: a number so constrained is written as one.
    if (node.types & kNumberType) node.types &= static_cast<uint8_t>(~kNumberType);
  }
}

// OpenAPI's integer formats as bounds (stricter than validators, which leave them unchecked).
void integer_format(SchemaNode& node, const std::string& format) {
  const int bits = format == "int32" ? 31 : format == "int64" ? 63 : 0;
  if (bits == 0 || !(node.types & kIntegerType)) return;
  const double largest = std::ldexp(1.0, bits);
  if (!node.minimum) node.minimum = NumberBound{-largest, false};
  if (!node.maximum) node.maximum = NumberBound{largest, true};
}

void Compiler::strings(SchemaNode& node, const Json& schema, const std::string& pointer) {
  auto count = [&](const char* key) -> int64_t {
    if (!schema.contains(key)) return -1;
    const Json& value = schema[key];
    if (!value.is_number_integer() || value.get<int64_t>() < 0)
      refuse(pointer, fmt::format("'{}' must be a non-negative integer", key));
    return value.get<int64_t>();
  };
  node.min_length = std::max<int64_t>(0, count("minLength"));
  node.max_length = count("maxLength");
  const std::string format = schema.contains("format") && schema["format"].is_string()
                                 ? schema["format"].get<std::string>()
                                 : "";
  if (!(node.types & kStringType)) {  // format and pattern assert over strings only
    integer_format(node, format);
    return;
  }
  if (schema.contains("pattern") && !format.empty() && format_language(format))
    refuse(pointer, "'pattern' beside 'format' is not supported");
  std::optional<RegexTree> language;
  if (schema.contains("pattern")) {
    if (!schema["pattern"].is_string()) refuse(pointer, "'pattern' must be a string");
    try {
      language = RegexTree::parse_search(schema["pattern"].get<std::string>());
    } catch (const GrammarError& error) {
      refuse(pointer, fmt::format("pattern: {}", error.what()));
    }
  } else if (schema.contains("format") && format != "binary") {  // binary: any string
    language = format_language(format);
    if (!language) refuse(pointer, fmt::format("format '{}' is not supported", format));
  }
  if (language) node.content = add_automaton(json_escaped(*language));
  const std::optional<int64_t> most =
      language && !schema.contains("pattern") ? format_max_length(format) : std::nullopt;
  if (most) node.max_length = node.max_length < 0 ? *most : std::min(node.max_length, *most);
}

void Compiler::arrays(int index, const Json& schema, const std::string& pointer) {
  std::vector<int> prefix;
  int items = -1;
  bool more = true;
  // Draft 7 writes the prefix as an array under "items" and the rest as "additionalItems";
  // 2020-12 writes "prefixItems" and "items".
  const bool items_array = schema.contains("items") && schema["items"].is_array();
  const Json* prefix_items = items_array                      ? &schema["items"]
                             : schema.contains("prefixItems") ? &schema["prefixItems"]
                                                              : nullptr;
  for (size_t i = 0; prefix_items && i < prefix_items->size(); ++i)
    prefix.push_back(node_for((*prefix_items)[i], fmt::format("{}/prefixItems/{}", pointer, i)));
  const Json* rest = nullptr;
  if (schema.contains("items") && !items_array) {
    rest = &schema["items"];
  } else if (items_array && schema.contains("additionalItems")) {
    rest = &schema["additionalItems"];
  }
  if (rest) {
    if (rest->is_boolean() && !rest->get<bool>()) {
      more = false;
    } else {
      items = node_for(*rest, pointer + "/items");
    }
  }
  SchemaNode& node = graph_.nodes[static_cast<size_t>(index)];
  node.prefix_items = std::move(prefix);
  node.items = items;
  node.more_items = more;
  node.min_items = schema.value("minItems", int64_t{0});
  node.max_items = schema.value("maxItems", int64_t{-1});
}

// Names the presence rules speak of are tracked as properties (of the additional shape where
// the schema does not declare them). A not-together set with a name the object cannot hold is
// always satisfied and dropped; a dependency whose trigger cannot be present too, and one
// whose dependents cannot be present forbids its trigger. Sorts `properties` and writes the
// rules as indices into them.
void Compiler::presence_rules(const PresenceRules& rules, bool open, int additional_node,
                              bool patterned, const std::string& pointer,
                              std::vector<SchemaNode::Property>& properties, SchemaNode& node) {
  auto find = [&](const std::string& name) {
    return std::find_if(properties.begin(), properties.end(),
                        [&](const auto& p) { return p.name == name; });
  };
  auto track = [&](const std::string& name) {
    if (find(escaped_name(name)) != properties.end()) return true;
    if (patterned) refuse(pointer, "'not' or dependencies beside patternProperties");
    if (open) properties.push_back({escaped_name(name), additional_node, false});
    return open;
  };
  std::vector<std::vector<std::string>> sets;
  std::vector<std::pair<std::string, std::vector<std::string>>> dependent;
  for (const std::vector<std::string>& names : rules.not_together)
    if (std::all_of(names.begin(), names.end(), track)) sets.push_back(names);
  for (const auto& [trigger, names] : rules.dependent) {
    if (!track(trigger)) continue;
    const bool possible = std::all_of(names.begin(), names.end(), track);
    if (possible) {
      dependent.emplace_back(trigger, names);
    } else {
      sets.push_back({trigger});
    }
  }
  std::sort(properties.begin(), properties.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  auto index_of = [&](const std::string& name) {
    return static_cast<size_t>(find(escaped_name(name)) - properties.begin());
  };
  for (const std::vector<std::string>& names : sets) {
    std::vector<size_t>& set = node.not_all_present.emplace_back();
    for (const std::string& name : names) set.push_back(index_of(name));
  }
  for (const auto& [trigger, names] : dependent) {
    std::vector<size_t> indices;
    for (const std::string& name : names) indices.push_back(index_of(name));
    node.dependent_required.emplace_back(index_of(trigger), std::move(indices));
  }
}

std::vector<std::pair<std::string, std::vector<std::string>>> Compiler::dependencies(
    const Json& schema, const std::string& pointer) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const char* key : {"dependentRequired", "dependencies"}) {
    if (!schema.contains(key)) continue;
    if (!schema[key].is_object()) refuse(pointer, fmt::format("'{}' must be an object", key));
    for (const auto& [trigger, names] : schema[key].items()) {
      if (!names.is_array())
        refuse(pointer,
               fmt::format("'{}' with a schema (for '{}') is not supported", key, trigger));
      std::vector<std::string>& list = out.emplace_back(trigger, std::vector<std::string>{}).second;
      for (const Json& name : names) {
        if (!name.is_string()) refuse(pointer, fmt::format("'{}' lists a non-string", key));
        list.push_back(name.get<std::string>());
      }
    }
  }
  return out;
}

void Compiler::objects(int index, const Json& schema, const std::string& pointer,
                       const std::vector<std::vector<std::string>>& not_together) {
  std::vector<SchemaNode::Property> properties;
  std::set<std::string> required;
  if (schema.contains("required")) {
    if (!schema["required"].is_array()) refuse(pointer, "'required' must be an array");
    for (const Json& name : schema["required"]) {
      if (!name.is_string()) refuse(pointer, "'required' lists a non-string");
      required.insert(name.get<std::string>());
    }
  }
  const Json* additional =
      schema.contains("additionalProperties") ? &schema["additionalProperties"] : nullptr;
  const bool closed = additional && additional->is_boolean() && !additional->get<bool>();
  int additional_node = -1;
  if (additional && !additional->is_boolean())
    additional_node = node_for(*additional, pointer + "/additionalProperties");
  // A declared name that a pattern matches must satisfy both schemas.
  std::vector<std::pair<ByteDfa, const Json*>> name_patterns;
  std::vector<std::pair<int, int>> patterned;
  if (schema.contains("patternProperties")) {
    for (const auto& [pattern, value] : schema["patternProperties"].items()) {
      RegexTree tree;
      try {
        tree = RegexTree::parse_search(pattern);
        name_patterns.emplace_back(ByteDfa(tree), &value);
      } catch (const GrammarError& error) {
        refuse(pointer, fmt::format("patternProperties: {}", error.what()));
      }
      const int automaton = add_automaton(json_escaped(tree));
      patterned.emplace_back(automaton, node_for(value, pointer + "/patternProperties/" + pattern));
    }
  }
  if (schema.contains("properties")) {
    for (const auto& [name, value] : schema["properties"].items()) {
      Json parts = Json::array({value});
      for (const auto& [dfa, pattern_schema] : name_patterns)
        if (matches_whole(dfa, name)) parts.push_back(*pattern_schema);
      const Json& shape = parts.size() == 1 ? value : keep(Json{{"allOf", std::move(parts)}});
      const int child = node_for(shape, pointer + "/properties/" + name);
      properties.push_back({escaped_name(name), child, required.erase(name) > 0});
    }
  }
  // Required names the schema does not declare take the additional shape.
  for (const std::string& name : required) {
    if (closed && patterned.empty())
      refuse(pointer, fmt::format("required property '{}' is not allowed by "
                                  "additionalProperties: false",
                                  name));
    if (!patterned.empty())
      refuse(pointer, fmt::format("required property '{}' beside patternProperties is not "
                                  "supported",
                                  name));
    properties.push_back({escaped_name(name), additional_node, true});
  }
  PresenceRules rules{not_together, dependencies(schema, pointer)};
  SchemaNode& node = graph_.nodes[static_cast<size_t>(index)];
  presence_rules(rules, !closed, additional_node, !patterned.empty(), pointer, properties, node);
  node.properties = std::move(properties);
  node.pattern_properties = std::move(patterned);
  node.additional = additional_node;
  node.more_properties = !closed;
  node.min_properties = schema.value("minProperties", int64_t{0});
  node.max_properties = schema.value("maxProperties", int64_t{-1});
}

}  // namespace

SchemaGraph SchemaGraph::compile(std::string_view schema_json) {
  if (schema_json.size() > kMaxSchemaBytes)
    throw GrammarError(fmt::format("json_schema: the schema is {} bytes, more than the {} allowed",
                                   schema_json.size(), kMaxSchemaBytes));
  Json document;
  try {
    // Deep nesting is refused as it is read (the parser's tree would recurse that deep).
    document = Json::parse(schema_json, [](int depth, Json::parse_event_t, Json&) {
      if (depth > kMaxJsonDepth)
        throw GrammarError(fmt::format("json_schema: nested deeper than {}", kMaxJsonDepth));
      return true;
    });
  } catch (const Json::exception& error) {
    throw GrammarError(fmt::format("json_schema: the schema is not valid JSON: {}", error.what()));
  }
  try {
    return Compiler(document).run();
  } catch (const Json::exception& error) {  // a keyword's value of the wrong JSON type
    throw GrammarError(fmt::format("json_schema: {}", error.what()));
  }
}

}  // namespace deepinfer::structured

// allOf as one schema (schema_merge.h), and the refusals and annotations the compiler shares.
#include "structured/schema_merge.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "structured/regex.h"

namespace deepinfer::structured {

[[noreturn]] void refuse(const std::string& pointer, const std::string& what) {
  throw GrammarError(fmt::format("json_schema: {} (at {})", what, pointer.empty() ? "#" : pointer));
}

namespace {

const std::set<std::string, std::less<>>& annotations() {
  static const std::set<std::string, std::less<>> names = {
      "$schema",      "$id",     "$comment",    "$anchor",         "title",
      "description",  "default", "examples",    "deprecated",      "readOnly",
      "writeOnly",    "$defs",   "definitions", "contentEncoding", "contentMediaType",
      "discriminator"};
  return names;
}

}  // namespace

bool is_annotation(const std::string& key) {
  return annotations().count(key) > 0 || key.rfind("x-", 0) == 0;
}

namespace {

// allOf as one schema: each keyword of the two intersected. Keywords the intersection of
// which the graph cannot express are refused.
class Merger {
 public:
  explicit Merger(const std::string& pointer) : at_(pointer) {}

  Json merge(const Json& a, const Json& b) {
    if (a.is_boolean()) return a.get<bool>() ? b : a;
    if (b.is_boolean()) return b.get<bool>() ? a : b;
    Json out = a;
    Json nested = Json::array();  // unions of b beside a union of a: each a branch's part
    for (const auto& [key, value] : b.items()) {
      if (is_item_keyword(key)) continue;  // merged by position below
      const bool union_key = key == "anyOf" || key == "oneOf";
      if (union_key && (out.contains("anyOf") || out.contains("oneOf"))) {
        nested.push_back(Json{{key, value}});
      } else if (!out.contains(key)) {
        out[key] = value;
      } else {
        out[key] = merge_keyword(key, out[key], value);
      }
    }
    if (!nested.empty()) {
      Json& branches = out.contains("anyOf") ? out["anyOf"] : out["oneOf"];
      for (Json& branch : branches) {
        Json parts = Json::array({branch});
        parts.insert(parts.end(), nested.begin(), nested.end());
        branch = Json{{"allOf", parts}};
      }
    }
    merge_items(out, a, b);
    // A property one side declares falls under the other side's additionalProperties.
    add_other_sides_rule(out, a, b);
    add_other_sides_rule(out, b, a);
    return out;
  }

 private:
  Json merge_keyword(const std::string& key, const Json& x, const Json& y) {
    if (is_annotation(key)) return x;
    if (key == "type") return intersect_types(x, y);
    if (key == "required") {
      std::set<std::string> names(x.begin(), x.end());
      for (const Json& name : y) names.insert(name.get<std::string>());
      return Json(std::vector<std::string>(names.begin(), names.end()));
    }
    if (key == "minimum" || key == "minLength" || key == "minItems" || key == "minProperties" ||
        key == "exclusiveMinimum")
      return x.is_number() && y.is_number() ? std::max(x, y) : both_same(key, x, y);
    if (key == "maximum" || key == "maxLength" || key == "maxItems" || key == "maxProperties" ||
        key == "exclusiveMaximum")
      return x.is_number() && y.is_number() ? std::min(x, y) : both_same(key, x, y);
    if (key == "properties" || key == "patternProperties" || key == "$defs" ||
        key == "definitions") {
      Json out = x;
      for (const auto& [name, schema] : y.items())
        out[name] = out.contains(name) ? all_of(out[name], schema) : schema;
      return out;
    }
    if (key == "additionalProperties") return all_of(x, y);
    if (key == "not") return Json{{"anyOf", Json::array({x, y})}};  // neither x nor y
    if (key == "multipleOf" && x.is_number_integer() && y.is_number_integer())
      return std::lcm(x.get<int64_t>(), y.get<int64_t>());
    if (key == "enum" || key == "const") {
      Json left = key == "const" ? Json::array({x}) : x,
           right = key == "const" ? Json::array({y}) : y;
      Json common = Json::array();
      for (const Json& value : left)
        if (std::find(right.begin(), right.end(), value) != right.end()) common.push_back(value);
      return key == "const" && common.size() == 1 ? common[0] : common;
    }
    return both_same(key, x, y);
  }

  Json all_of(const Json& x, const Json& y) { return Json{{"allOf", Json::array({x, y})}}; }
  Json both(const Json& x, const Json& y) {
    return x == Json(true) ? y : y == Json(true) ? x : all_of(x, y);
  }

  static bool is_item_keyword(const std::string& key) {
    return key == "prefixItems" || key == "items" || key == "additionalItems";
  }

  // A side's item shapes by position: the prefix, then the rest (draft 7 writes the prefix as
  // an "items" array and the rest as "additionalItems"; 2020-12 "prefixItems" and "items").
  static std::pair<std::vector<Json>, Json> item_shapes(const Json& side) {
    std::vector<Json> prefix;
    Json rest = true;
    if (side.contains("items") && side["items"].is_array()) {
      prefix.assign(side["items"].begin(), side["items"].end());
      if (side.contains("additionalItems")) rest = side["additionalItems"];
    } else {
      if (side.contains("prefixItems") && side["prefixItems"].is_array())
        prefix.assign(side["prefixItems"].begin(), side["prefixItems"].end());
      if (side.contains("items")) rest = side["items"];
    }
    return {prefix, rest};
  }

  // Item i of the merge satisfies item i of both sides (a side's rest past its prefix).
  void merge_items(Json& out, const Json& a, const Json& b) {
    auto has_items = [](const Json& side) {
      return side.contains("prefixItems") || side.contains("items") ||
             side.contains("additionalItems");
    };
    if (!has_items(a) || !has_items(b)) {
      if (has_items(b))
        for (const char* key : {"prefixItems", "items", "additionalItems"})
          if (b.contains(key)) out[key] = b[key];
      return;
    }
    const auto [prefix_a, rest_a] = item_shapes(a);
    const auto [prefix_b, rest_b] = item_shapes(b);
    Json prefix = Json::array();
    for (size_t i = 0; i < std::max(prefix_a.size(), prefix_b.size()); ++i)
      prefix.push_back(both(i < prefix_a.size() ? prefix_a[i] : rest_a,
                            i < prefix_b.size() ? prefix_b[i] : rest_b));
    for (const char* key : {"prefixItems", "items", "additionalItems"}) out.erase(key);
    if (!prefix.empty()) out["prefixItems"] = std::move(prefix);
    if (Json rest = both(rest_a, rest_b); rest != Json(true)) out["items"] = std::move(rest);
  }

  Json both_same(const std::string& key, const Json& x, const Json& y) {
    if (x == y) return x;
    refuse(at_, fmt::format("allOf: two different '{}' cannot be combined", key));
  }

  static Json intersect_types(const Json& x, const Json& y) {
    auto names = [](const Json& t) {
      std::set<std::string> out;
      if (t.is_string()) out.insert(t.get<std::string>());
      for (const Json& one : t.is_array() ? t : Json::array()) out.insert(one.get<std::string>());
      // An integer is a number.
      if (out.count("number")) out.insert("integer");
      return out;
    };
    std::set<std::string> left = names(x), right = names(y);
    Json common = Json::array();
    for (const std::string& name : left)
      if (right.count(name)) common.push_back(name);
    return common;
  }

  // Properties of `side` that `other` does not declare: `other`'s additionalProperties (or a
  // matching patternProperties, which we cannot intersect) applies to them.
  void add_other_sides_rule(Json& out, const Json& side, const Json& other) {
    if (!side.is_object() || !other.is_object() || !side.contains("properties")) return;
    const Json declared = other.value("properties", Json::object());
    if (other.contains("patternProperties") && !side["properties"].empty())
      refuse(at_, "allOf: properties beside another branch's patternProperties");
    if (!other.contains("additionalProperties")) return;
    for (const auto& [name, schema] : side["properties"].items()) {
      if (declared.contains(name)) continue;
      out["properties"][name] = all_of(out["properties"][name], other["additionalProperties"]);
    }
  }

  std::string at_;
};

}  // namespace

Json merge_schemas(const Json& a, const Json& b, const std::string& pointer) {
  return Merger(pointer).merge(a, b);
}

}  // namespace deepinfer::structured

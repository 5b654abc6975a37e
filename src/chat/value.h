// Values of the chat-template language (the Jinja subset chat templates use): none,
// undefined, booleans, integers, floats, strings, lists, insertion-ordered dicts, and
// callables (macros, builtins, bound methods).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

namespace deepinfer::chat {

class Value;
using List = std::vector<Value>;
// Python dicts keep insertion order, and tojson prints keys in that order.
using Dict = std::vector<std::pair<std::string, Value>>;

struct CallArguments;
using Function = std::function<Value(CallArguments&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // undefined
  static Value none();
  Value(bool value);  // NOLINT: implicit on purpose, values mix freely
  Value(int64_t value);
  Value(int value) : Value(static_cast<int64_t>(value)) {}
  Value(double value);
  Value(std::string value);
  Value(const char* value) : Value(std::string(value)) {}
  Value(List value);
  Value(Dict value);
  static Value function(Function fn);
  // A namespace() object: a dict whose attributes can be assigned.
  static Value from_json(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_callable() const { return kind_ == Kind::kFunction; }

  bool as_bool() const;  // truthiness
  int64_t as_int() const;
  double as_float() const;
  const std::string& as_string() const;  // requires is_string()
  const List& as_list() const;
  List& as_list();
  const Dict& as_dict() const;
  Dict& as_dict();
  const Function& as_function() const;

  // Dict lookup; undefined when absent.
  Value get(const std::string& key) const;
  void set(const std::string& key, Value value);  // dicts only
  // Python's str(): what {{ value }} prints.
  std::string str() const;
  // Python's json.dumps(ensure_ascii=False) with the given indent (< 0: single line) and
  // separators, as transformers' tojson filter.
  std::string to_json(int indent, bool sort_keys = false) const;
  std::string type_name() const;
  bool equals(const Value& other) const;
  // Python ordering for sort/min/max and comparisons; Error when incomparable.
  int compare(const Value& other) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0.0;
  std::shared_ptr<std::string> string_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> function_;
};

// Arguments of a call: positional, then keyword.
struct CallArguments {
  List positional;
  Dict keyword;
  // The positional argument `index`, else keyword `name`, else `fallback`.
  Value get(size_t index, const char* name, Value fallback = Value()) const;
};

std::string python_float_repr(double value);

}  // namespace deepinfer::chat

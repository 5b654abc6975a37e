#include "chat/value.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace deepinfer::chat {

Value Value::none() {
  Value value;
  value.kind_ = Kind::kNone;
  return value;
}

Value::Value(bool value) : kind_(Kind::kBool), bool_(value) {}
Value::Value(int64_t value) : kind_(Kind::kInt), int_(value) {}
Value::Value(double value) : kind_(Kind::kFloat), float_(value) {}
Value::Value(std::string value)
    : kind_(Kind::kString), string_(std::make_shared<std::string>(std::move(value))) {}
Value::Value(List value) : kind_(Kind::kList), list_(std::make_shared<List>(std::move(value))) {}
Value::Value(Dict value) : kind_(Kind::kDict), dict_(std::make_shared<Dict>(std::move(value))) {}

Value Value::function(Function fn) {
  Value value;
  value.kind_ = Kind::kFunction;
  value.function_ = std::make_shared<Function>(std::move(fn));
  return value;
}

Value Value::from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List list;
      for (const auto& item : json) list.push_back(from_json(item));
      return Value(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict dict;
      for (const auto& [key, item] : json.items()) dict.emplace_back(key, from_json(item));
      return Value(std::move(dict));
    }
    default:
      fail("chat template input: unsupported JSON value {}", json.dump());
  }
}

bool Value::as_bool() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return bool_;
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0.0;
    case Kind::kString:
      return !string_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

int64_t Value::as_int() const {
  if (kind_ == Kind::kInt) return int_;
  if (kind_ == Kind::kBool) return bool_ ? 1 : 0;
  if (kind_ == Kind::kFloat) return static_cast<int64_t>(float_);
  fail("expected an integer, got {}", type_name());
}

double Value::as_float() const {
  if (kind_ == Kind::kFloat) return float_;
  return static_cast<double>(as_int());
}

const std::string& Value::as_string() const {
  if (kind_ != Kind::kString) fail("expected a string, got {}", type_name());
  return *string_;
}

const List& Value::as_list() const {
  if (kind_ != Kind::kList) fail("expected a list, got {}", type_name());
  return *list_;
}
List& Value::as_list() {
  if (kind_ != Kind::kList) fail("expected a list, got {}", type_name());
  return *list_;
}
const Dict& Value::as_dict() const {
  if (kind_ != Kind::kDict) fail("expected a dict, got {}", type_name());
  return *dict_;
}
Dict& Value::as_dict() {
  if (kind_ != Kind::kDict) fail("expected a dict, got {}", type_name());
  return *dict_;
}
const Function& Value::as_function() const {
  if (kind_ != Kind::kFunction) fail("{} is not callable", type_name());
  return *function_;
}

Value Value::get(const std::string& key) const {
  if (kind_ != Kind::kDict) return Value();
  for (const auto& [name, value] : *dict_) {
    if (name == key) return value;
  }
  return Value();
}

void Value::set(const std::string& key, Value value) {
  Dict& dict = as_dict();
  for (auto& [name, existing] : dict) {
    if (name == key) {
      existing = std::move(value);
      return;
    }
  }
  dict.emplace_back(key, std::move(value));
}

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Shortest representation that round-trips, with ".0" for integral values (Python repr).
  for (int precision = 1; precision <= 17; ++precision) {
    std::string text = fmt::format("{:.{}g}", value, precision);
    if (std::stod(text) == value) {
      if (text.find_first_of(".en") == std::string::npos) text += ".0";
      return text;
    }
  }
  return fmt::format("{}", value);
}

namespace {

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (unsigned char ch : text) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (ch < 0x20) {
          out += fmt::format("\\u{:04x}", ch);
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

}  // namespace

std::string Value::to_json(int indent, bool sort_keys) const {
  std::function<std::string(const Value&, int)> dump = [&](const Value& value, int depth) {
    std::string newline, inner_pad, outer_pad;
    if (indent >= 0) {
      newline = "\n";
      inner_pad = std::string(static_cast<size_t>(indent * (depth + 1)), ' ');
      outer_pad = std::string(static_cast<size_t>(indent * depth), ' ');
    }
    std::string item_separator = indent >= 0 ? "," : ", ";
    switch (value.kind()) {
      case Kind::kUndefined:
      case Kind::kNone:
        return std::string("null");
      case Kind::kBool:
        return std::string(value.bool_ ? "true" : "false");
      case Kind::kInt:
        return std::to_string(value.int_);
      case Kind::kFloat:
        return std::isfinite(value.float_) ? python_float_repr(value.float_)
                                           : std::string(std::isnan(value.float_) ? "NaN"
                                                         : value.float_ > 0       ? "Infinity"
                                                                                  : "-Infinity");
      case Kind::kString:
        return json_string(*value.string_);
      case Kind::kList: {
        if (value.list_->empty()) return std::string("[]");
        std::string out = "[" + newline;
        for (size_t i = 0; i < value.list_->size(); ++i) {
          if (i) out += item_separator + newline;
          out += inner_pad + dump((*value.list_)[i], depth + 1);
        }
        return out + newline + outer_pad + "]";
      }
      case Kind::kDict: {
        if (value.dict_->empty()) return std::string("{}");
        Dict entries = *value.dict_;
        if (sort_keys) {
          std::stable_sort(entries.begin(), entries.end(),
                           [](const auto& a, const auto& b) { return a.first < b.first; });
        }
        std::string out = "{" + newline;
        for (size_t i = 0; i < entries.size(); ++i) {
          if (i) out += item_separator + newline;
          out +=
              inner_pad + json_string(entries[i].first) + ": " + dump(entries[i].second, depth + 1);
        }
        return out + newline + outer_pad + "}";
      }
      case Kind::kFunction:
        fail("tojson: a function is not JSON serializable");
    }
    return std::string();
  };
  return dump(*this, 0);
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return bool_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kFloat:
      return python_float_repr(float_);
    case Kind::kString:
      return *string_;
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        const Value& item = (*list_)[i];
        out += (i ? ", " : "") + (item.is_string() ? "'" + item.str() + "'" : item.str());
      }
      return out + "]";
    }
    case Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < dict_->size(); ++i) {
        const auto& [key, item] = (*dict_)[i];
        out += (i ? ", '" : "'") + key +
               "': " + (item.is_string() ? "'" + item.str() + "'" : item.str());
      }
      return out + "}";
    }
    case Kind::kFunction:
      return "<function>";
  }
  return "";
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kFunction:
      return "function";
  }
  return "";
}

bool Value::equals(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (kind_ == Kind::kInt && other.kind_ == Kind::kInt) return int_ == other.int_;
    return as_float() == other.as_float();
  }
  if ((kind_ == Kind::kBool && other.is_number()) || (is_number() && other.kind_ == Kind::kBool))
    return as_float() == other.as_float();
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return bool_ == other.bool_;
    case Kind::kString:
      return *string_ == *other.string_;
    case Kind::kList:
      if (list_->size() != other.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i)
        if (!(*list_)[i].equals((*other.list_)[i])) return false;
      return true;
    case Kind::kDict:
      if (dict_->size() != other.dict_->size()) return false;
      for (const auto& [key, item] : *dict_)
        if (!other.get(key).equals(item)) return false;
      return true;
    default:
      return function_ == other.function_;
  }
}

int Value::compare(const Value& other) const {
  if ((is_number() || kind_ == Kind::kBool) && (other.is_number() || other.kind_ == Kind::kBool)) {
    double a = as_float(), b = other.as_float();
    return a < b ? -1 : a > b ? 1 : 0;
  }
  if (is_string() && other.is_string())
    return string_->compare(*other.string_) < 0 ? -1 : *string_ == *other.string_ ? 0 : 1;
  if (is_list() && other.is_list()) {
    for (size_t i = 0; i < std::min(list_->size(), other.list_->size()); ++i) {
      int order = (*list_)[i].compare((*other.list_)[i]);
      if (order != 0) return order;
    }
    return list_->size() < other.list_->size() ? -1 : list_->size() > other.list_->size() ? 1 : 0;
  }
  fail("'<' not supported between {} and {}", type_name(), other.type_name());
}

Value CallArguments::get(size_t index, const char* name, Value fallback) const {
  if (index < positional.size()) return positional[index];
  for (const auto& [key, value] : keyword) {
    if (key == name) return value;
  }
  return fallback;
}

}  // namespace deepinfer::chat

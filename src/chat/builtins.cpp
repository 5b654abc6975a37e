#include "chat/builtins.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace deepinfer::chat {
namespace {

bool is_space(char ch) {
  return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
}

std::string strip(const std::string& text, const Value& chars, bool left, bool right) {
  auto strippable = [&](char ch) {
    return chars.is_string() ? chars.as_string().find(ch) != std::string::npos : is_space(ch);
  };
  size_t begin = 0, end = text.size();
  while (left && begin < end && strippable(text[begin])) ++begin;
  while (right && end > begin && strippable(text[end - 1])) --end;
  return text.substr(begin, end - begin);
}

List split(const std::string& text, const Value& separator, int64_t max_splits) {
  List parts;
  if (!separator.is_string()) {
    size_t at = 0;
    while (true) {
      while (at < text.size() && is_space(text[at])) ++at;
      if (at >= text.size()) break;
      if (max_splits >= 0 && static_cast<int64_t>(parts.size()) == max_splits) {
        parts.emplace_back(text.substr(at));
        break;
      }
      size_t end = at;
      while (end < text.size() && !is_space(text[end])) ++end;
      parts.emplace_back(text.substr(at, end - at));
      at = end;
    }
    return parts;
  }
  const std::string& sep = separator.as_string();
  if (sep.empty()) fail("empty separator");
  size_t at = 0;
  while (true) {
    size_t found = text.find(sep, at);
    if (found == std::string::npos ||
        (max_splits >= 0 && static_cast<int64_t>(parts.size()) == max_splits)) {
      parts.emplace_back(text.substr(at));
      return parts;
    }
    parts.emplace_back(text.substr(at, found - at));
    at = found + sep.size();
  }
}

std::string replace_all(std::string text, const std::string& from, const std::string& to,
                        int64_t count) {
  if (from.empty()) return text;
  std::string out;
  size_t at = 0;
  for (int64_t done = 0; count < 0 || done < count; ++done) {
    size_t found = text.find(from, at);
    if (found == std::string::npos) break;
    out.append(text, at, found - at);
    out += to;
    at = found + from.size();
  }
  out.append(text, at, std::string::npos);
  return out;
}

std::string ascii_case(std::string text, bool upper) {
  for (char& ch : text) {
    if (upper && ch >= 'a' && ch <= 'z') ch = static_cast<char>(ch - 32);
    if (!upper && ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch + 32);
  }
  return text;
}

std::string title_case(std::string text) {
  bool start = true;
  for (char& ch : text) {
    bool letter = std::isalpha(static_cast<unsigned char>(ch));
    if (letter) ch = static_cast<char>(start ? std::toupper(ch) : std::tolower(ch));
    start = !letter;
  }
  return text;
}

// Python's length of a string counts code points.
int64_t length_of(const Value& value) {
  if (value.is_string()) {
    int64_t count = 0;
    for (char ch : value.as_string()) count += (static_cast<unsigned char>(ch) & 0xc0) != 0x80;
    return count;
  }
  if (value.is_list()) return static_cast<int64_t>(value.as_list().size());
  if (value.is_dict()) return static_cast<int64_t>(value.as_dict().size());
  if (value.is_undefined()) return 0;
  fail("object of type '{}' has no len()", value.type_name());
}

List items_of(const Value& value) {
  List items;
  for (const auto& [key, item] : value.as_dict()) items.emplace_back(List{Value(key), item});
  return items;
}

// Iteration as Python does it: lists, dict keys, string characters.
List iterate(const Value& value) {
  if (value.is_list()) return value.as_list();
  if (value.is_dict()) {
    List keys;
    for (const auto& entry : value.as_dict()) keys.emplace_back(entry.first);
    return keys;
  }
  if (value.is_string()) {
    List chars;
    const std::string& text = value.as_string();
    for (size_t i = 0; i < text.size();) {
      size_t length = 1;
      while (i + length < text.size() &&
             (static_cast<unsigned char>(text[i + length]) & 0xc0) == 0x80)
        ++length;
      chars.emplace_back(text.substr(i, length));
      i += length;
    }
    return chars;
  }
  if (value.is_undefined() || value.is_none()) return {};
  fail("'{}' object is not iterable", value.type_name());
}

Value attribute_of(const Value& value, const std::string& path) {
  Value current = value;
  size_t at = 0;
  while (at <= path.size()) {
    size_t dot = path.find('.', at);
    std::string part = path.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
    current = current.is_dict() ? current.get(part) : Value();
    if (dot == std::string::npos) break;
    at = dot + 1;
  }
  return current;
}

// select/reject by a test (default: truthiness) on the item or its attribute.
Value select(const Value& input, CallArguments& arguments, bool by_attribute, bool keep) {
  List kept;
  size_t next = 0;
  std::string attribute;
  if (by_attribute) attribute = arguments.get(next++, "attribute").as_string();
  Value test_name = arguments.get(next++, "test");
  for (const Value& item : iterate(input)) {
    Value subject = by_attribute ? attribute_of(item, attribute) : item;
    bool passed = subject.as_bool();
    if (test_name.is_string()) {
      CallArguments test_arguments;
      for (size_t i = next; i < arguments.positional.size(); ++i)
        test_arguments.positional.push_back(arguments.positional[i]);
      if (!apply_test(test_name.as_string(), subject, test_arguments, passed))
        fail("no test named '{}'", test_name.as_string());
    }
    if (passed == keep) kept.push_back(item);
  }
  return Value(std::move(kept));
}

Value sorted(const Value& input, CallArguments& arguments) {
  List items = iterate(input);
  bool reverse = arguments.get(0, "reverse", Value(false)).as_bool();
  Value attribute = arguments.get(2, "attribute");
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    Value left = attribute.is_string() ? attribute_of(a, attribute.as_string()) : a;
    Value right = attribute.is_string() ? attribute_of(b, attribute.as_string()) : b;
    return reverse ? right.compare(left) < 0 : left.compare(right) < 0;
  });
  return Value(std::move(items));
}

std::string indent(const std::string& text, CallArguments& arguments) {
  Value width = arguments.get(0, "width", Value(4));
  std::string pad =
      width.is_string() ? width.as_string() : std::string(static_cast<size_t>(width.as_int()), ' ');
  bool first = arguments.get(1, "first", Value(false)).as_bool();
  bool blank = arguments.get(2, "blank", Value(false)).as_bool();
  std::string out;
  size_t at = 0;
  bool first_line = true;
  while (at <= text.size()) {
    size_t newline = text.find('\n', at);
    std::string line =
        text.substr(at, newline == std::string::npos ? std::string::npos : newline - at);
    bool pad_line = (first_line ? first : true) && (blank || !line.empty());
    out += (pad_line ? pad : "") + line;
    if (newline == std::string::npos) break;
    out += '\n';
    at = newline + 1;
    first_line = false;
  }
  return out;
}

}  // namespace

Value item(const Value& container, const Value& key) {
  if (container.is_dict()) {
    if (!key.is_string()) return Value();
    return container.get(key.as_string());
  }
  if (container.is_list() || container.is_string()) {
    List items = container.is_list() ? container.as_list() : iterate(container);
    if (!key.is_number()) fail("indices must be integers, not {}", key.type_name());
    int64_t index = key.as_int();
    auto size = static_cast<int64_t>(items.size());
    if (index < 0) index += size;
    if (index < 0 || index >= size) return Value();
    return items[static_cast<size_t>(index)];
  }
  if (container.is_undefined()) fail("cannot index an undefined value");
  fail("'{}' object is not subscriptable", container.type_name());
}

Value slice(const Value& sequence, const Value& start, const Value& stop, const Value& step) {
  List items = iterate(sequence);
  auto size = static_cast<int64_t>(items.size());
  int64_t stride = step.is_number() ? step.as_int() : 1;
  if (stride == 0) fail("slice step cannot be zero");
  auto bound = [&](const Value& value, int64_t fallback) {
    if (!value.is_number()) return fallback;
    int64_t index = value.as_int();
    if (index < 0) index += size;
    return stride > 0 ? std::clamp<int64_t>(index, 0, size)
                      : std::clamp<int64_t>(index, -1, size - 1);
  };
  int64_t begin = bound(start, stride > 0 ? 0 : size - 1);
  int64_t end = bound(stop, stride > 0 ? size : -1);
  List out;
  for (int64_t i = begin; stride > 0 ? i < end : i > end; i += stride)
    out.push_back(items[static_cast<size_t>(i)]);
  if (sequence.is_string()) {
    std::string text;
    for (const Value& ch : out) text += ch.as_string();
    return Value(text);
  }
  return Value(std::move(out));
}

bool contains(const Value& container, const Value& needle) {
  if (container.is_string()) {
    if (!needle.is_string()) fail("'in <string>' requires a string, not {}", needle.type_name());
    return container.as_string().find(needle.as_string()) != std::string::npos;
  }
  if (container.is_dict())
    return needle.is_string() && !container.get(needle.as_string()).is_undefined();
  if (container.is_list()) {
    for (const Value& value : container.as_list())
      if (value.equals(needle)) return true;
    return false;
  }
  if (container.is_undefined()) return false;
  fail("argument of type '{}' is not iterable", container.type_name());
}

namespace {

// Filters that produce text: trim, tojson, case, replace, join, default.
bool text_filter(const std::string& name, const Value& input, CallArguments& arguments,
                 Value& result) {
  if (name == "trim") {
    result = Value(strip(input.str(), arguments.get(0, "chars"), true, true));
  } else if (name == "length" || name == "count") {
    result = Value(length_of(input));
  } else if (name == "tojson") {
    Value width = arguments.get(0, "indent");
    result = Value(input.to_json(width.is_number() ? static_cast<int>(width.as_int()) : -1,
                                 arguments.get(1, "sort_keys", Value(false)).as_bool()));
  } else if (name == "upper" || name == "lower") {
    result = Value(ascii_case(input.str(), name == "upper"));
  } else if (name == "title") {
    result = Value(title_case(input.str()));
  } else if (name == "capitalize") {
    std::string text = ascii_case(input.str(), false);
    if (!text.empty())
      text[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(text[0])));
    result = Value(text);
  } else if (name == "replace") {
    result =
        Value(replace_all(input.str(), arguments.get(0, "old").str(), arguments.get(1, "new").str(),
                          arguments.get(2, "count", Value(-1)).as_int()));
  } else if (name == "join") {
    std::string separator = arguments.get(0, "d", Value("")).str();
    Value attribute = arguments.get(1, "attribute");
    std::string out;
    List items = iterate(input);
    for (size_t i = 0; i < items.size(); ++i) {
      out +=
          (i ? separator : "") +
          (attribute.is_string() ? attribute_of(items[i], attribute.as_string()) : items[i]).str();
    }
    result = Value(out);
  } else if (name == "default" || name == "d") {
    bool boolean = arguments.get(1, "boolean", Value(false)).as_bool();
    bool use_default = input.is_undefined() || (boolean && !input.as_bool());
    result = use_default ? arguments.get(0, "default_value", Value("")) : input;
  } else {
    return false;
  }
  return true;
}

// Filters that pick or convert values: first/last, list, string, numbers, items.
bool value_filter(const std::string& name, const Value& input, CallArguments& arguments,
                  Value& result) {
  if (name == "first" || name == "last") {
    List items = iterate(input);
    result = items.empty() ? Value() : (name == "first" ? items.front() : items.back());
  } else if (name == "list") {
    result = Value(iterate(input));
  } else if (name == "string") {
    result = Value(input.str());
  } else if (name == "int") {
    if (input.is_string()) {
      try {
        result = Value(static_cast<int64_t>(std::stoll(input.as_string())));
      } catch (const std::exception&) {
        result = arguments.get(0, "default", Value(0));
      }
    } else {
      result = input.is_number() || input.kind() == Value::Kind::kBool ? Value(input.as_int())
                                                                       : Value(0);
    }
  } else if (name == "float") {
    if (input.is_string()) {
      // Python's float(): surrounding spaces allowed, too large is inf, anything else that
      // is not a whole number falls back to the default.
      const std::string& text = input.as_string();
      const char* begin = text.c_str();
      char* end = nullptr;
      double number = std::strtod(begin, &end);
      while (*end == ' ' || *end == '\t' || *end == '\n') ++end;
      bool whole = end != begin && static_cast<size_t>(end - begin) == text.size();
      result = whole ? Value(number) : arguments.get(0, "default", Value(0.0));
    } else {
      result = Value(input.as_float());
    }
  } else if (name == "abs") {
    result = input.kind() == Value::Kind::kInt ? Value(std::abs(input.as_int()))
                                               : Value(std::fabs(input.as_float()));
  } else if (name == "round") {
    double factor =
        std::pow(10.0, static_cast<double>(arguments.get(0, "precision", Value(0)).as_int()));
    result = Value(std::round(input.as_float() * factor) / factor);
  } else if (name == "items") {
    result = input.is_undefined() ? Value(List{}) : Value(items_of(input));
  } else if (name == "dictsort") {
    List items = items_of(input);
    std::stable_sort(items.begin(), items.end(), [](const Value& a, const Value& b) {
      return a.as_list()[0].compare(b.as_list()[0]) < 0;
    });
    result = Value(std::move(items));
  } else {
    return false;
  }
  return true;
}

// Filters over sequences (select, map, sort, ...) and markup helpers.
bool sequence_filter(const std::string& name, const Value& input, CallArguments& arguments,
                     Value& result) {
  if (name == "selectattr" || name == "rejectattr") {
    result = select(input, arguments, true, name == "selectattr");
  } else if (name == "select" || name == "reject") {
    result = select(input, arguments, false, name == "select");
  } else if (name == "map") {
    List out;
    Value attribute = arguments.get(99, "attribute");
    Value filter = arguments.get(0, "filter");
    for (const Value& element : iterate(input)) {
      if (attribute.is_string()) {
        Value mapped = attribute_of(element, attribute.as_string());
        out.push_back(mapped.is_undefined() ? arguments.get(99, "default") : mapped);
      } else if (filter.is_string()) {
        CallArguments rest;
        for (size_t i = 1; i < arguments.positional.size(); ++i)
          rest.positional.push_back(arguments.positional[i]);
        Value mapped;
        if (!apply_filter(filter.as_string(), element, rest, mapped))
          fail("no filter named '{}'", filter.as_string());
        out.push_back(mapped);
      } else {
        fail("map needs attribute= or a filter name");
      }
    }
    result = Value(std::move(out));
  } else if (name == "reverse") {
    result = slice(input, Value(), Value(), Value(-1));
  } else if (name == "sort") {
    result = sorted(input, arguments);
  } else if (name == "unique") {
    List out;
    for (const Value& element : iterate(input)) {
      if (std::none_of(out.begin(), out.end(),
                       [&](const Value& seen) { return seen.equals(element); }))
        out.push_back(element);
    }
    result = Value(std::move(out));
  } else if (name == "min" || name == "max") {
    List items = iterate(input);
    if (items.empty()) {
      result = Value();
    } else {
      result = *std::min_element(items.begin(), items.end(), [&](const Value& a, const Value& b) {
        return name == "min" ? a.compare(b) < 0 : b.compare(a) < 0;
      });
    }
  } else if (name == "sum") {
    Value total = arguments.get(1, "start", Value(0));
    for (const Value& element : iterate(input)) {
      total = total.kind() == Value::Kind::kInt && element.kind() == Value::Kind::kInt
                  ? Value(total.as_int() + element.as_int())
                  : Value(total.as_float() + element.as_float());
    }
    result = total;
  } else if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
    // transformers renders without autoescape, so escaping filters leave text as it is except
    // the explicit ones.
    if (name == "safe") {
      result = input;
    } else {
      std::string text = input.str();
      text = replace_all(text, "&", "&amp;", -1);
      text = replace_all(text, "<", "&lt;", -1);
      text = replace_all(text, ">", "&gt;", -1);
      text = replace_all(text, "\"", "&#34;", -1);
      result = Value(replace_all(text, "'", "&#39;", -1));
    }
  } else if (name == "indent") {
    result = Value(indent(input.str(), arguments));
  } else if (name == "wordcount") {
    result = Value(static_cast<int64_t>(split(input.str(), Value(), -1).size()));
  } else {
    return false;
  }
  return true;
}

// Python str methods templates call (strip, split, startswith, replace, ...).
Value string_method(const std::string& text, const std::string& name, CallArguments& args) {
  if (name == "strip") return Value(strip(text, args.get(0, "chars"), true, true));
  if (name == "lstrip") return Value(strip(text, args.get(0, "chars"), true, false));
  if (name == "rstrip") return Value(strip(text, args.get(0, "chars"), false, true));
  if (name == "split")
    return Value(split(text, args.get(0, "sep"), args.get(1, "maxsplit", Value(-1)).as_int()));
  if (name == "splitlines")
    return Value(split(replace_all(text, "\r\n", "\n", -1), Value("\n"), -1));
  if (name == "startswith" || name == "endswith") {
    Value affixes = args.get(0, "prefix");
    List options = affixes.is_list() ? affixes.as_list() : List{affixes};
    for (const Value& option : options) {
      const std::string& affix = option.as_string();
      bool match = affix.size() <= text.size() &&
                   (name == "startswith"
                        ? text.compare(0, affix.size(), affix) == 0
                        : text.compare(text.size() - affix.size(), affix.size(), affix) == 0);
      if (match) return Value(true);
    }
    return Value(false);
  }
  if (name == "upper" || name == "lower") return Value(ascii_case(text, name == "upper"));
  if (name == "title") return Value(title_case(text));
  if (name == "capitalize") {
    std::string out = ascii_case(text, false);
    if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
    return Value(out);
  }
  if (name == "replace")
    return Value(replace_all(text, args.get(0, "old").as_string(), args.get(1, "new").as_string(),
                             args.get(2, "count", Value(-1)).as_int()));
  if (name == "find") {
    size_t at = text.find(args.get(0, "sub").as_string());
    return Value(at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(at));
  }
  if (name == "count") {
    const std::string& sub = args.get(0, "sub").as_string();
    int64_t count = 0;
    for (size_t at = sub.empty() ? std::string::npos : text.find(sub); at != std::string::npos;
         at = text.find(sub, at + sub.size())) {
      ++count;
    }
    return Value(count);
  }
  if (name == "join") {
    std::string out;
    List items = iterate(args.get(0, "iterable"));
    for (size_t i = 0; i < items.size(); ++i) out += (i ? text : "") + items[i].as_string();
    return Value(out);
  }
  fail("str.{}() is not supported", name);
}

}  // namespace

bool apply_filter(const std::string& name, const Value& input, CallArguments& arguments,
                  Value& result) {
  return text_filter(name, input, arguments, result) ||
         value_filter(name, input, arguments, result) ||
         sequence_filter(name, input, arguments, result);
}

bool apply_test(const std::string& name, const Value& input, CallArguments& arguments,
                bool& result) {
  using Kind = Value::Kind;
  if (name == "defined") {
    result = !input.is_undefined();
  } else if (name == "undefined") {
    result = input.is_undefined();
  } else if (name == "none") {
    result = input.is_none();
  } else if (name == "string") {
    result = input.is_string();
  } else if (name == "number") {
    result = input.is_number();
  } else if (name == "integer") {
    result = input.kind() == Kind::kInt;
  } else if (name == "float") {
    result = input.kind() == Kind::kFloat;
  } else if (name == "boolean") {
    result = input.kind() == Kind::kBool;
  } else if (name == "true" || name == "false") {
    result = input.kind() == Kind::kBool && input.as_bool() == (name == "true");
  } else if (name == "mapping") {
    result = input.is_dict();
  } else if (name == "iterable") {
    result = input.is_list() || input.is_dict() || input.is_string();
  } else if (name == "sequence") {
    result = input.is_list() || input.is_string() || input.is_dict();
  } else if (name == "callable") {
    result = input.is_callable();
  } else if (name == "eq" || name == "equalto" || name == "==") {
    result = input.equals(arguments.get(0, "other"));
  } else if (name == "ne" || name == "!=") {
    result = !input.equals(arguments.get(0, "other"));
  } else if (name == "in") {
    result = contains(arguments.get(0, "seq"), input);
  } else if (name == "odd" || name == "even") {
    result = (input.as_int() % 2 != 0) == (name == "odd");
  } else if (name == "divisibleby") {
    int64_t divisor = arguments.get(0, "num").as_int();
    if (divisor == 0) fail("divisibleby 0");
    result = input.as_int() % divisor == 0;
  } else if (name == "lower" || name == "upper") {
    std::string text = input.str();
    result = ascii_case(text, name == "upper") == text;
  } else if (name == "gt" || name == "ge" || name == "lt" || name == "le") {
    int order = input.compare(arguments.get(0, "other"));
    result = name == "gt"   ? order > 0
             : name == "ge" ? order >= 0
             : name == "lt" ? order < 0
                            : order <= 0;
  } else {
    return false;
  }
  return true;
}

bool bound_method(const Value& object, const std::string& name, Value& result) {
  if (object.is_string()) {
    std::string text = object.as_string();
    static const char* kMethods[] = {"strip",      "lstrip",   "rstrip",     "split",
                                     "startswith", "endswith", "upper",      "lower",
                                     "replace",    "title",    "capitalize", "find",
                                     "count",      "join",     "splitlines", "format"};
    if (std::find_if(std::begin(kMethods), std::end(kMethods),
                     [&](const char* m) { return name == m; }) == std::end(kMethods)) {
      return false;
    }
    result = Value::function(
        [text, name](CallArguments& args) { return string_method(text, name, args); });
    return true;
  }
  if (object.is_dict()) {
    if (name != "items" && name != "keys" && name != "values" && name != "get") return false;
    result = Value::function([object, name](CallArguments& args) -> Value {
      if (name == "items") return Value(items_of(object));
      if (name == "get") {
        Value found = object.get(args.get(0, "key").str());
        return found.is_undefined() ? args.get(1, "default", Value::none()) : found;
      }
      List out;
      for (const auto& [key, value] : object.as_dict())
        out.push_back(name == "keys" ? Value(key) : value);
      return Value(std::move(out));
    });
    return true;
  }
  if (object.is_list()) {
    if (name != "index" && name != "count" && name != "append") return false;
    result = Value::function([target = object, name](CallArguments& args) mutable -> Value {
      Value needle = args.get(0, "value");
      if (name == "append") {
        target.as_list().push_back(needle);
        return Value::none();
      }
      const List& items = target.as_list();
      int64_t count = 0;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].equals(needle)) continue;
        if (name == "index") return Value(static_cast<int64_t>(i));
        ++count;
      }
      if (name == "index") fail("value is not in list");
      return Value(count);
    });
    return true;
  }
  return false;
}

bool global_function(const std::string& name, Value& result) {
  if (name == "namespace" || name == "dict") {
    result = Value::function([](CallArguments& args) -> Value {
      Dict fields;
      if (!args.positional.empty() && args.positional[0].is_dict())
        fields = args.positional[0].as_dict();
      for (auto& [key, value] : args.keyword) fields.emplace_back(key, value);
      return Value(std::move(fields));
    });
  } else if (name == "range") {
    result = Value::function([](CallArguments& args) -> Value {
      int64_t start = 0, stop = 0, step = 1;
      if (args.positional.size() == 1) {
        stop = args.positional[0].as_int();
      } else if (args.positional.size() >= 2) {
        start = args.positional[0].as_int();
        stop = args.positional[1].as_int();
        if (args.positional.size() > 2) step = args.positional[2].as_int();
      }
      if (step == 0) fail("range() step must not be zero");
      constexpr int64_t kMaxRange = 1'000'000;
      List out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (static_cast<int64_t>(out.size()) >= kMaxRange)
          fail("range() longer than {}", kMaxRange);
        out.emplace_back(i);
      }
      return Value(std::move(out));
    });
  } else if (name == "raise_exception") {
    result = Value::function([](CallArguments& args) -> Value {
      fail("{}", args.get(0, "message", Value("error raised by the template")).str());
    });
  } else if (name == "strftime_now") {
    result = Value::function([](CallArguments& args) -> Value {
      std::string format = args.get(0, "format", Value("%Y-%m-%d")).str();
      std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buffer[256];
      size_t length = std::strftime(buffer, sizeof(buffer), format.c_str(), &local);
      return Value(std::string(buffer, length));
    });
  } else {
    return false;
  }
  return true;
}

}  // namespace deepinfer::chat

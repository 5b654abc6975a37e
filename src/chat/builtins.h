// Filters, tests, methods and globals of the chat-template language. Internal.
#pragma once

#include <string>

#include "chat/value.h"

namespace deepinfer::chat {

// Each returns false when `name` is not a builtin of that kind.
bool apply_filter(const std::string& name, const Value& input, CallArguments& arguments,
                  Value& result);
bool apply_test(const std::string& name, const Value& input, CallArguments& arguments,
                bool& result);
// obj.name as a bound method of a string, list or dict ("strip", "items", ...).
bool bound_method(const Value& object, const std::string& name, Value& result);
// namespace(), range(), raise_exception(), strftime_now(), dict().
bool global_function(const std::string& name, Value& result);

// Python truthiness-free helpers shared with the renderer.
Value slice(const Value& sequence, const Value& start, const Value& stop, const Value& step);
Value item(const Value& container, const Value& key);
bool contains(const Value& container, const Value& needle);

}  // namespace deepinfer::chat

// JSON from text nobody vouches for (request bodies, model output, files on disk), parsed with
// a bound on nesting. Copying, comparing and printing a JSON value recurse once per level, so
// an unbounded tree from a 33 KB body ("[[[[...") would overflow the stack wherever it went
// next; with every tree at most kMaxJsonDepth deep, everything downstream is safe.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace deepinfer {

// Deeper than any real request, schema or tool call; shallow enough for every recursive walk.
constexpr int kMaxJsonDepth = 128;

enum class JsonParse { kOk, kInvalid, kTooDeep };

namespace detail {
struct JsonTooDeep {};
}  // namespace detail

// Parses `text` into `out` (nlohmann::json or ordered_json). kInvalid for malformed text,
// kTooDeep when arrays and objects nest more than `max_depth` levels; `out` is then null.
template <typename Json>
JsonParse parse_json(std::string_view text, Json& out, int max_depth = kMaxJsonDepth) {
  // An array or object starts at `depth` = the number of containers around it.
  auto limit = [max_depth](int depth, typename Json::parse_event_t event, Json&) {
    if ((event == Json::parse_event_t::array_start || event == Json::parse_event_t::object_start) &&
        depth >= max_depth)
      throw detail::JsonTooDeep{};
    return true;
  };
  try {
    out = Json::parse(text, limit, /*allow_exceptions=*/false);
  } catch (const detail::JsonTooDeep&) {
    out = nullptr;
    return JsonParse::kTooDeep;
  }
  if (out.is_discarded()) {
    out = nullptr;
    return JsonParse::kInvalid;
  }
  return JsonParse::kOk;
}

// The parsed value, or a discarded one (as Json::parse(text, nullptr, false) gives for
// malformed text) when `text` is malformed or nests too deep.
template <typename Json>
Json parse_json_or_discarded(std::string_view text, int max_depth = kMaxJsonDepth) {
  Json value;
  if (parse_json(text, value, max_depth) != JsonParse::kOk) return Json(Json::value_t::discarded);
  return value;
}

// `value` as compact JSON text. Strings that hold invalid UTF-8 (a model can emit any bytes,
// a client can send them in a field) are written with U+FFFD in place of each bad byte instead
// of throwing.
template <typename Json>
std::string json_text(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace deepinfer

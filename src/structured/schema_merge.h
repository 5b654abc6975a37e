// What the JSON Schema compiler's parts share: refusing a keyword by name and where it is,
// the keywords that only annotate, and allOf merged into one schema.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace deepinfer::structured {

using Json = nlohmann::json;

// Throws GrammarError naming `what` and the JSON pointer where it is.
[[noreturn]] void refuse(const std::string& pointer, const std::string& what);

// Keywords that assert nothing (titles, descriptions, x- extensions, ...).
bool is_annotation(const std::string& key);

// allOf of `a` and `b` as one schema: each keyword of the two intersected (items by
// position). Keywords whose intersection the graph cannot express are refused at `pointer`.
Json merge_schemas(const Json& a, const Json& b, const std::string& pointer);

}  // namespace deepinfer::structured

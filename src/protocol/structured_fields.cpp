// The request fields that constrain output beyond json_object: vLLM's structured_outputs
// object ({regex, choice, json, grammar}) and its older guided_* fields.
#include <fmt/format.h>

#include "protocol/limits.h"
#include "protocol/openai.h"

namespace deepinfer::protocol {
namespace {

std::vector<std::string> read_choices(const Json& value, const std::string& field,
                                      const std::string& param) {
  if (!value.is_array() || value.empty())
    throw ApiError(400, fmt::format("'{}' must be a non-empty array of strings", field), param);
  if (value.size() > RequestLimits::kChoices)
    throw ApiError(
        400, fmt::format("'{}' holds more than {} choices", field, RequestLimits::kChoices), param);
  std::vector<std::string> choices;
  for (const Json& choice : value) {
    if (!choice.is_string())
      throw ApiError(
          400, fmt::format("'{}' must hold strings, not {}", field, json_type_name(choice)), param);
    choices.push_back(choice.get<std::string>());
  }
  return choices;
}

// One constraint kind: regex, choice, json or grammar (structural tags are refused by name).
void read_kind(const std::string& kind, const Json& value, const std::string& field,
               StructuredOutput& out) {
  if (value.is_null()) return;
  const std::string param = field.substr(0, field.find('.'));
  if (out.any())
    throw ApiError(400, fmt::format("'{}': a request takes one output constraint", field), param);
  out.field = param;
  if (kind == "regex" || kind == "grammar") {
    if (!value.is_string() || value.get<std::string>().empty())
      throw ApiError(400, fmt::format("'{}' must be a non-empty string", field), param);
    (kind == "regex" ? out.regex : out.grammar) = value.get<std::string>();
  } else if (kind == "choice") {
    out.choice = read_choices(value, field, param);
  } else if (kind == "json") {
    out.json_schema = read_schema(value, field, param);
  } else {
    throw ApiError(400,
                   fmt::format("'{}' is not supported: regex, choice, json and grammar "
                               "constraints are",
                               field),
                   param);
  }
}

}  // namespace

std::string read_schema(const Json& value, const std::string& field, const std::string& param) {
  if (value.is_object() || value.is_boolean()) return value.dump();
  if (value.is_string()) {
    try {
      return parse_json_object(value.get<std::string>()).dump();
    } catch (const ApiError& error) {
      throw ApiError(400, fmt::format("'{}': {}", field, error.what()), param);
    }
  }
  throw ApiError(400, fmt::format("'{}' must be a JSON Schema (an object)", field), param);
}

void read_structured_output(const Json& body, GenerationParams& params) {
  StructuredOutput& out = params.structured;
  if (auto found = body.find("structured_outputs"); found != body.end() && !found->is_null()) {
    if (!found->is_object())
      throw ApiError(400, "'structured_outputs' must be an object", "structured_outputs");
    for (const char* kind : {"regex", "choice", "json", "grammar", "structural_tag"}) {
      if (auto value = found->find(kind); value != found->end())
        read_kind(kind, *value, fmt::format("structured_outputs.{}", kind), out);
    }
  }
  for (const char* kind : {"regex", "choice", "json", "grammar"}) {
    const std::string field = fmt::format("guided_{}", kind);
    if (auto value = body.find(field); value != body.end()) read_kind(kind, *value, field, out);
  }
  if (out.any() && params.json_output)
    throw ApiError(400,
                   "response_format json_object and a regex, choice, json or grammar constraint "
                   "exclude each other",
                   "response_format");
}

}  // namespace deepinfer::protocol

#include "protocol/output_constraints.h"

#include <algorithm>
#include <optional>

#include "structured/regex.h"

namespace deepinfer::protocol {

OutputConstraints::OutputConstraints(const Tokenizer& tokenizer, std::vector<int32_t> end_tokens)
    : tokenizer_(tokenizer), end_tokens_(std::move(end_tokens)) {}

std::shared_ptr<const structured::TokenTable> OutputConstraints::table() {
  std::call_once(table_once_, [this] {
    std::vector<int32_t> control;
    for (int32_t id = 0; id < tokenizer_.vocab_size(); ++id)
      if (tokenizer_.is_special(id)) control.push_back(id);
    table_ =
        std::make_shared<structured::TokenTable>(tokenizer_.token_bytes(), end_tokens_, control);
    json_object_ = structured::json_object_constraint(table_);
  });
  return table_;
}

namespace {

std::string tool_name(const Json& function) {
  const auto name = function.find("name");
  return name != function.end() && name->is_string() ? name->get<std::string>() : "";
}

}  // namespace

template <typename Make>
std::shared_ptr<const structured::Constraint> OutputConstraints::compiled(const std::string& key,
                                                                          Make&& make) {
  {
    std::lock_guard lock(compiled_mutex_);
    if (auto found = compiled_.find(key); found != compiled_.end()) return found->second;
  }
  std::shared_ptr<const structured::Constraint> made = make();
  std::lock_guard lock(compiled_mutex_);
  if (compiled_.size() >= kKept) compiled_.clear();
  compiled_.emplace(key, made);
  return made;
}

std::shared_ptr<const structured::Constraint> OutputConstraints::of(
    const GenerationParams& params) {
  if (params.json_output) {
    table();
    return json_object_;
  }
  const StructuredOutput& wanted = params.structured;
  if (!wanted.any()) return nullptr;
  std::string key = !wanted.json_schema.empty() ? "json:" + wanted.json_schema
                    : !wanted.grammar.empty()   ? "grammar:" + wanted.grammar
                    : wanted.regex.empty()      ? "choice"
                                                : "regex:" + wanted.regex;
  for (const std::string& choice : wanted.choice) key += '\0' + choice;
  return compiled(key, [&] {
    try {
      if (!wanted.json_schema.empty())
        return structured::json_schema_constraint(table(), wanted.json_schema);
      if (!wanted.grammar.empty()) return structured::grammar_constraint(table(), wanted.grammar);
      if (!wanted.regex.empty()) return structured::regex_constraint(table(), wanted.regex);
      return structured::choice_constraint(table(), wanted.choice);
    } catch (const structured::GrammarError& error) {
      throw ApiError(400, error.what(), wanted.field);
    }
  });
}

std::string OutputConstraints::enforced_parameters(const Json& function) {
  const std::string schema = function.contains("parameters") && !function["parameters"].is_null()
                                 ? function["parameters"].dump()
                                 : R"({"type": "object"})";
  try {
    compiled("json:" + schema, [&] { return structured::json_schema_constraint(table(), schema); });
    return schema;
  } catch (const structured::GrammarError& error) {
    const auto strict = function.find("strict");
    if (strict != function.end() && strict->is_boolean() && strict->get<bool>())
      throw ApiError(400,
                     fmt::format("tool '{}' is strict, but its parameters cannot be enforced: {}",
                                 tool_name(function), error.what()),
                     "tools");
    return R"({"type": "object"})";
  }
}

// The closing text of a forced call as tokens, its control tokens recognised (the format's
// own text, never the client's).
std::vector<int32_t> OutputConstraints::closing_ids(const std::string& closing) const {
  return closing.empty() ? std::vector<int32_t>{}
                         : tokenizer_.encode(closing, EncodeMode::kSpecials, false);
}

std::shared_ptr<const structured::Constraint> OutputConstraints::tool_call(
    const chat::ChatRequest& request, const OutputSyntax& syntax, const std::string& closing) {
  using Mode = chat::ToolChoice::Mode;
  if (!request.tools.is_array() || request.tools.empty()) return nullptr;
  const bool named = request.tool_choice.mode == Mode::kNamed;
  const bool json_arguments =
      syntax.tools == ToolFormat::kHermesJson || syntax.tools == ToolFormat::kDeepSeekV3;
  if (named && json_arguments) {
    for (const auto& tool : request.tools) {
      const Json function =
          tool.is_object() ? tool.value("function", Json::object()) : Json::object();
      if (tool_name(function) != request.tool_choice.name) continue;
      const std::string schema = enforced_parameters(function);
      // enforced_parameters compiled and kept the arguments' schema: wrapped, not compiled again.
      auto arguments = compiled(
          "json:" + schema, [&] { return structured::json_schema_constraint(table(), schema); });
      return structured::then_closing(std::move(arguments), *table(), closing_ids(closing), true);
    }
    return nullptr;
  }
  if (syntax.tools != ToolFormat::kHermesJson) return nullptr;
  const bool required = request.tool_choice.mode == Mode::kRequired;
  if (!required && request.tool_choice.mode != Mode::kAuto) return nullptr;
  // Auto: a call the model opens with the block's tag (one token) is held to the schemas when
  // some tool asks for it (strict).
  std::optional<int32_t> opening = tokenizer_.token_to_id(syntax.tool_start);
  if (!required) {
    const bool strict = std::any_of(request.tools.begin(), request.tools.end(), [](const Json& t) {
      const Json function = t.is_object() ? t.value("function", Json::object()) : Json::object();
      const auto flag = function.find("strict");
      return flag != function.end() && flag->is_boolean() && flag->get<bool>();
    });
    if (!strict || !opening) return nullptr;
  }
  // Hermes: the block's tag is followed by the call object.
  Json calls = Json::array();
  for (const auto& tool : request.tools) {
    const Json function =
        tool.is_object() ? tool.value("function", Json::object()) : Json::object();
    calls.push_back({{"type", "object"},
                     {"properties",
                      {{"name", {{"const", tool_name(function)}}},
                       {"arguments", Json::parse(enforced_parameters(function))}}},
                     {"required", {"name", "arguments"}},
                     {"additionalProperties", false}});
  }
  const std::string schema = Json{{"anyOf", calls}}.dump();
  auto call = compiled("json:" + schema, [&] {
    try {
      return structured::json_schema_constraint(table(), schema);
    } catch (const structured::GrammarError& error) {
      throw ApiError(400, error.what(), "tools");
    }
  });
  if (required) return structured::then_closing(call, *table(), closing_ids(closing), false);
  return structured::after_each(*opening, call);
}

std::shared_ptr<const structured::Constraint> OutputConstraints::after_reasoning(
    std::shared_ptr<const structured::Constraint> constraint, const OutputSyntax& syntax) const {
  if (!constraint) return constraint;
  auto start = tokenizer_.token_to_id(syntax.reasoning_start);
  auto end = tokenizer_.token_to_id(syntax.reasoning_end);
  if (!start || !end) return constraint;
  return structured::after_reasoning(std::move(constraint), *start, *end,
                                     syntax.starts_in_reasoning);
}

}  // namespace deepinfer::protocol

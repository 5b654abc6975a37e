#include "protocol/output_constraints.h"

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

std::shared_ptr<const structured::Constraint> OutputConstraints::of(
    const GenerationParams& params) {
  if (params.json_output) {
    table();
    return json_object_;
  }
  const StructuredOutput& wanted = params.structured;
  if (!wanted.any()) return nullptr;
  std::string key = !wanted.json_schema.empty() ? "json:" + wanted.json_schema
                    : wanted.regex.empty()      ? "choice"
                                                : "regex:" + wanted.regex;
  for (const std::string& choice : wanted.choice) key += '\0' + choice;
  {
    std::lock_guard lock(compiled_mutex_);
    if (auto found = compiled_.find(key); found != compiled_.end()) return found->second;
  }
  std::shared_ptr<const structured::Constraint> made;
  try {
    if (!wanted.json_schema.empty()) {
      made = structured::json_schema_constraint(table(), wanted.json_schema);
    } else if (!wanted.regex.empty()) {
      made = structured::regex_constraint(table(), wanted.regex);
    } else {
      made = structured::choice_constraint(table(), wanted.choice);
    }
  } catch (const structured::GrammarError& error) {
    throw ApiError(400, error.what(), wanted.field);
  }
  std::lock_guard lock(compiled_mutex_);
  if (compiled_.size() >= kKept) compiled_.clear();
  compiled_.emplace(std::move(key), made);
  return made;
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

// What a request's output-constraint fields (response_format json_object, structured_outputs,
// guided_*) turn into for the engine, shared by the server and offline batches.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "chat/model_template.h"
#include "protocol/openai.h"
#include "protocol/output_parser.h"
#include "structured/structured.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::protocol {

// Constraints compiled against one tokenizer's vocabulary. The vocabulary's byte table is
// built on first use (a fraction of a second for 150k tokens); compiled regex and choice
// constraints are kept for repeated requests. Safe to call from several threads.
class OutputConstraints {
 public:
  static constexpr size_t kKept = 64;  // compiled constraints kept

  // `end_tokens`: the model's EOS ids, which end a constrained output where it is complete.
  OutputConstraints(const Tokenizer& tokenizer, std::vector<int32_t> end_tokens);

  // Null when `params` ask for no constraint; ApiError 400 for a pattern the engine refuses.
  std::shared_ptr<const structured::Constraint> of(const GenerationParams& params);
  // Tool calls whose arguments the model writes as JSON, held to the tools' parameters
  // schemas: a forced call's arguments (named; the prompt opened the call up to them) or call
  // object (required, Hermes: {"name", "arguments"} of one of the tools), then `closing` (the
  // format's text that closes the call: a named call then ends the output, a required one
  // leaves the model free to make more); with tool_choice auto and a strict tool, every call
  // the model opens with the Hermes tag. Null for other calls and formats. A strict tool whose
  // schema the engine refuses is a 400; another tool's arguments are then left free.
  std::shared_ptr<const structured::Constraint> tool_call(const chat::ChatRequest& request,
                                                          const OutputSyntax& syntax,
                                                          const std::string& closing);
  // `constraint` starting after a reasoning model's reasoning (the tags of `syntax`); itself
  // when the model has none.
  std::shared_ptr<const structured::Constraint> after_reasoning(
      std::shared_ptr<const structured::Constraint> constraint, const OutputSyntax& syntax) const;

 private:
  std::shared_ptr<const structured::TokenTable> table();
  std::vector<int32_t> closing_ids(const std::string& closing) const;
  // The constraint kept under `key`, or `make`'s, kept.
  template <typename Make>
  std::shared_ptr<const structured::Constraint> compiled(const std::string& key, Make&& make);
  // The tool's parameters schema as it will be enforced: itself, or (a tool that is not
  // strict, whose schema the engine refuses) any object.
  std::string enforced_parameters(const Json& function);

  const Tokenizer& tokenizer_;
  std::vector<int32_t> end_tokens_;
  std::once_flag table_once_;
  std::shared_ptr<const structured::TokenTable> table_;
  std::shared_ptr<const structured::Constraint> json_object_;
  std::mutex compiled_mutex_;
  std::map<std::string, std::shared_ptr<const structured::Constraint>> compiled_;
};

}  // namespace deepinfer::protocol

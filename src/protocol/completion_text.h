// The text of one completion as its tokens arrive: incremental detokenization, the output
// parser (reasoning, tool calls) where the model has one, and stop strings (held back while
// they might still match, dropped with everything after them). With a parser, stop strings
// apply to the answer text only, not to reasoning or tool-call blocks.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "protocol/output_parser.h"
#include "sampling/sampling.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::protocol {

class CompletionText {
 public:
  // `tokenizer` may be null (token ids only: text stays empty).
  CompletionText(const Tokenizer* tokenizer, std::vector<std::string> stop_strings,
                 std::optional<OutputParser> parser = std::nullopt);
  // What is final after this token (often nothing). Without a parser all of it is content.
  // Once stopped() nothing more is added.
  ParsedOutput push(int32_t token);
  // At the end: what was held back (nothing after a stop string matched; an unfinished tool
  // call stays visible as content).
  ParsedOutput finish();
  bool stopped() const { return stopped_; }
  bool parsed() const { return parser_.has_value(); }
  // The stop string that matched ("" if none).
  std::string matched_stop() const { return stops_ ? stops_->matched() : std::string(); }
  // Everything so far.
  const ParsedOutput& total() const { return total_; }
  const std::string& text() const { return total_.content; }

 private:
  ParsedOutput take(std::string piece, bool last, size_t control_from);

  const Tokenizer* tokenizer_;
  std::unique_ptr<StreamingDetokenizer> detokenizer_;
  std::unique_ptr<sampling::StopStrings> stops_;
  std::optional<OutputParser> parser_;
  ParsedOutput total_;
  bool stopped_ = false;
  bool finished_ = false;
};

}  // namespace deepinfer::protocol

// The text of one completion as its tokens arrive: incremental detokenization and stop
// strings (held back while they might still match, dropped with everything after them).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "sampling/sampling.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::protocol {

class CompletionText {
 public:
  // `tokenizer` may be null (token ids only: text stays empty).
  CompletionText(const Tokenizer* tokenizer, std::vector<std::string> stop_strings);
  // Text that is final after this token ("" often). Once stopped() nothing more is added.
  std::string push(int32_t token);
  // At the end: what was held back (nothing after a stop string matched).
  std::string finish();
  bool stopped() const { return stopped_; }
  // The stop string that matched ("" if none).
  std::string matched_stop() const { return stops_ ? stops_->matched() : std::string(); }
  const std::string& text() const { return text_; }

 private:
  std::unique_ptr<StreamingDetokenizer> detokenizer_;
  std::unique_ptr<sampling::StopStrings> stops_;
  std::string text_;
  bool stopped_ = false;
  bool finished_ = false;
};

}  // namespace deepinfer::protocol

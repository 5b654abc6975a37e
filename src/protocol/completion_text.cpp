#include "protocol/completion_text.h"

namespace deepinfer::protocol {

CompletionText::CompletionText(const Tokenizer* tokenizer, std::vector<std::string> stop_strings) {
  if (tokenizer) detokenizer_ = std::make_unique<StreamingDetokenizer>(*tokenizer, true);
  if (!stop_strings.empty())
    stops_ = std::make_unique<sampling::StopStrings>(std::move(stop_strings));
}

std::string CompletionText::push(int32_t token) {
  if (!detokenizer_ || stopped_ || finished_) return "";
  std::string piece = detokenizer_->push(token);
  if (stops_) piece = stops_->push(piece, stopped_);
  text_ += piece;
  return piece;
}

std::string CompletionText::finish() {
  if (!detokenizer_ || finished_) return "";
  finished_ = true;
  if (stopped_) return "";
  std::string tail = detokenizer_->finish();
  if (stops_) {
    tail = stops_->push(tail, stopped_);
    if (!stopped_) tail += stops_->flush();
  }
  text_ += tail;
  return tail;
}

}  // namespace deepinfer::protocol

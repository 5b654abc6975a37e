#include "protocol/completion_text.h"

namespace deepinfer::protocol {

CompletionText::CompletionText(const Tokenizer* tokenizer, std::vector<std::string> stop_strings,
                               std::optional<OutputParser> parser)
    : tokenizer_(tokenizer), parser_(std::move(parser)) {
  if (tokenizer) detokenizer_ = std::make_unique<StreamingDetokenizer>(*tokenizer, true);
  if (!stop_strings.empty())
    stops_ = std::make_unique<sampling::StopStrings>(std::move(stop_strings));
}

// Parses a detokenized piece and runs its answer text past the stop strings.
ParsedOutput CompletionText::take(std::string piece, bool last, size_t control_from) {
  ParsedOutput out;
  if (parser_) {
    out = parser_->push(piece, control_from);
    if (last) {
      ParsedOutput rest = parser_->finish();
      out.reasoning += rest.reasoning;
      out.content += rest.content;
      for (ToolCall& call : rest.tool_calls) out.tool_calls.push_back(std::move(call));
      for (ToolCallPiece& part : rest.call_pieces) out.call_pieces.push_back(std::move(part));
    }
  } else {
    out.content = std::move(piece);
  }
  if (stops_) {
    out.content = stops_->push(out.content, stopped_);
    if (last && !stopped_) out.content += stops_->flush();
    if (stopped_) {  // after the stop string nothing counts
      out.tool_calls.clear();
      out.call_pieces.clear();
    }
  }
  total_.reasoning += out.reasoning;
  total_.content += out.content;
  for (const ToolCall& call : out.tool_calls) total_.tool_calls.push_back(call);
  return out;
}

ParsedOutput CompletionText::push(int32_t token) {
  if (!detokenizer_ || stopped_ || finished_) return {};
  std::string piece = detokenizer_->push(token);
  // A control token's text ends the piece (after any bytes held back before it).
  size_t control_from = std::string::npos;
  if (tokenizer_->is_added(token)) {
    std::string content = tokenizer_->id_to_token(token);
    if (piece.size() >= content.size() &&
        piece.compare(piece.size() - content.size(), content.size(), content) == 0)
      control_from = piece.size() - content.size();
  }
  return take(std::move(piece), false, control_from);
}

ParsedOutput CompletionText::finish() {
  if (!detokenizer_ || finished_) return {};
  finished_ = true;
  if (stopped_) return {};
  return take(detokenizer_->finish(), true, std::string::npos);
}

}  // namespace deepinfer::protocol

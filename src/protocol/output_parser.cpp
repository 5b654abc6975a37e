#include "protocol/output_parser.h"

#include <fmt/format.h>

#include <algorithm>

namespace deepinfer::protocol {

OutputSyntax detect_output_syntax(const Tokenizer& tokenizer) {
  OutputSyntax syntax;
  if (tokenizer.token_to_id("<think>") && tokenizer.token_to_id("</think>")) {
    syntax.reasoning_start = "<think>";
    syntax.reasoning_end = "</think>";
  }
  if (tokenizer.token_to_id("<tool_call>") && tokenizer.token_to_id("</tool_call>")) {
    syntax.tool_start = "<tool_call>";
    syntax.tool_end = "</tool_call>";
  }
  return syntax;
}

OutputParser::OutputParser(OutputSyntax syntax, std::string id_prefix)
    : syntax_(std::move(syntax)),
      id_prefix_(std::move(id_prefix)),
      mode_(syntax_.starts_in_reasoning ? Mode::kReasoning : Mode::kContent) {}

void OutputParser::emit(ParsedOutput& out, Mode mode, std::string_view text) {
  if (text.empty()) return;
  std::string& target = mode == Mode::kReasoning ? out.reasoning : out.content;
  target.append(text);
  (mode == Mode::kReasoning ? total_.reasoning : total_.content).append(text);
}

// How many trailing bytes of `text` could be the start of a marker this mode looks for.
size_t OutputParser::held_back(std::string_view text) const {
  std::vector<const std::string*> markers;
  if (mode_ == Mode::kReasoning) markers = {&syntax_.reasoning_end};
  if (mode_ == Mode::kContent) markers = {&syntax_.reasoning_start, &syntax_.tool_start};
  size_t hold = 0;
  for (const std::string* marker : markers) {
    for (size_t length = std::min(marker->size() - (marker->empty() ? 0 : 1), text.size());
         length > hold; --length) {
      if (text.substr(text.size() - length) == std::string_view(*marker).substr(0, length)) {
        hold = length;
        break;
      }
    }
  }
  return hold;
}

// Consumes the buffer up to the next marker; false when it needs more text.
bool OutputParser::step(ParsedOutput& out) {
  if (mode_ == Mode::kToolCall) {
    size_t end = buffer_.find(syntax_.tool_end);
    if (end == std::string::npos) return false;
    std::string body = buffer_.substr(0, end);
    buffer_.erase(0, end + syntax_.tool_end.size());
    mode_ = Mode::kContent;
    auto call = nlohmann::json::parse(body, nullptr, false);
    if (call.is_discarded() || !call.is_object() || !call.contains("name") ||
        !call["name"].is_string()) {
      // Not a call after all: the model's text stays visible.
      emit(out, Mode::kContent, syntax_.tool_start + body + syntax_.tool_end);
      return true;
    }
    nlohmann::json arguments = call.value("arguments", nlohmann::json::object());
    if (arguments.is_string()) {
      auto parsed = nlohmann::json::parse(arguments.get<std::string>(), nullptr, false);
      if (!parsed.is_discarded()) arguments = parsed;
    }
    ToolCall tool{fmt::format("{}{}", id_prefix_, total_.tool_calls.size()),
                  call["name"].get<std::string>(), arguments.dump()};
    out.tool_calls.push_back(tool);
    total_.tool_calls.push_back(std::move(tool));
    return true;
  }
  const std::string& end_marker = syntax_.reasoning_end;
  size_t at = std::string::npos, marker_size = 0;
  Mode next = mode_;
  if (mode_ == Mode::kReasoning) {
    at = buffer_.find(end_marker);
    marker_size = end_marker.size();
    next = Mode::kContent;
  } else {
    for (auto [marker, mode] : {std::pair{&syntax_.reasoning_start, Mode::kReasoning},
                                std::pair{&syntax_.tool_start, Mode::kToolCall}}) {
      if (marker->empty()) continue;
      size_t found = buffer_.find(*marker);
      if (found < at) {
        at = found;
        marker_size = marker->size();
        next = mode;
      }
    }
  }
  if (at == std::string::npos) return false;
  emit(out, mode_, std::string_view(buffer_).substr(0, at));
  buffer_.erase(0, at + marker_size);
  mode_ = next;
  return true;
}

ParsedOutput OutputParser::push(std::string_view text) {
  ParsedOutput out;
  buffer_.append(text);
  while (step(out)) {
  }
  if (mode_ != Mode::kToolCall) {
    size_t keep = held_back(buffer_);
    emit(out, mode_, std::string_view(buffer_).substr(0, buffer_.size() - keep));
    buffer_.erase(0, buffer_.size() - keep);
  }
  return out;
}

ParsedOutput OutputParser::finish() {
  ParsedOutput out;
  if (mode_ == Mode::kToolCall) {
    emit(out, Mode::kContent, syntax_.tool_start + buffer_);
  } else {
    emit(out, mode_, buffer_);
  }
  buffer_.clear();
  mode_ = Mode::kContent;
  return out;
}

}  // namespace deepinfer::protocol

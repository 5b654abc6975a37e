#include "protocol/output_parser.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/json.h"

namespace deepinfer::protocol {

namespace {
const char* const kV3CallsBegin = "<｜tool▁calls▁begin｜>";
const char* const kV3CallsEnd = "<｜tool▁calls▁end｜>";
const std::string kV3CallBegin = "<｜tool▁call▁begin｜>";
const std::string kV3CallEnd = "<｜tool▁call▁end｜>";
const std::string kV3Sep = "<｜tool▁sep｜>";
const char* const kDsmlOpen =
    "<\xEF\xBD\x9C"
    "DSML"
    "\xEF\xBD\x9C";
}  // namespace

OutputSyntax detect_output_syntax(const Tokenizer& tokenizer) {
  OutputSyntax syntax;
  syntax.control_markers = true;  // every marker below is an added token
  if (tokenizer.token_to_id("<think>") && tokenizer.token_to_id("</think>")) {
    syntax.reasoning_start = "<think>";
    syntax.reasoning_end = "</think>";
  }
  // V4 vocabularies may still hold V3's tool tokens; DSML is what they write.
  if (tokenizer.token_to_id(std::string_view(kDsmlOpen).substr(1))) {
    syntax.tools = ToolFormat::kDsml;
    syntax.tool_start = kDsmlOpen;
  } else if (tokenizer.token_to_id(kV3CallsBegin) && tokenizer.token_to_id(kV3CallsEnd)) {
    syntax.tools = ToolFormat::kDeepSeekV3;
    syntax.tool_start = kV3CallsBegin;
    syntax.tool_end = kV3CallsEnd;
  } else if (tokenizer.token_to_id("<tool_call>") && tokenizer.token_to_id("</tool_call>")) {
    syntax.tools = ToolFormat::kHermesJson;
    syntax.tool_start = "<tool_call>";
    syntax.tool_end = "</tool_call>";
  }
  return syntax;
}

namespace {

// "<｜DSML｜" and the closing tags of a block and its parts, in both spellings (V4.1 puts a
// space after ｜DSML｜).
const std::string kDsmlMark =
    "\xEF\xBD\x9C"
    "DSML"
    "\xEF\xBD\x9C";

std::optional<std::pair<size_t, size_t>> find_either(std::string_view text, const std::string& a,
                                                     const std::string& b, size_t from = 0) {
  size_t at_a = text.find(a, from), at_b = text.find(b, from);
  if (at_a == std::string::npos && at_b == std::string::npos) return std::nullopt;
  if (at_b < at_a) return std::pair{at_b, b.size()};
  return std::pair{at_a, a.size()};
}

// The value of attribute `name="..."` inside a tag's text.
std::optional<std::string> attribute(std::string_view tag, const char* name) {
  std::string key = std::string(name) + "=\"";
  size_t at = tag.find(key);
  if (at == std::string::npos) return std::nullopt;
  size_t begin = at + key.size(), end = tag.find('"', begin);
  if (end == std::string::npos) return std::nullopt;
  return std::string(tag.substr(begin, end - begin));
}

}  // namespace

std::optional<std::vector<ToolCall>> parse_deepseek_v3_calls(std::string_view body,
                                                             const std::string& id_prefix,
                                                             size_t first_index) {
  std::vector<ToolCall> calls;
  for (size_t at = 0; (at = body.find(kV3CallBegin, at)) != std::string::npos;) {
    size_t begin = at + kV3CallBegin.size();
    size_t end = body.find(kV3CallEnd, begin);
    size_t sep = body.find(kV3Sep, begin);
    if (end == std::string::npos || sep == std::string::npos || sep > end) return std::nullopt;
    std::string head(body.substr(begin, sep - begin));
    std::string rest(body.substr(sep + kV3Sep.size(), end - sep - kV3Sep.size()));
    std::string name = head, arguments = rest;
    if (head == "function") {  // NAME\n```json\nARGS\n```
      size_t newline = rest.find('\n');
      if (newline == std::string::npos) return std::nullopt;
      name = rest.substr(0, newline);
      arguments = rest.substr(newline + 1);
      if (arguments.rfind("```json", 0) == 0) arguments.erase(0, 7);
      size_t fence = arguments.rfind("```");
      if (fence != std::string::npos) arguments.erase(fence);
    }
    auto parsed = parse_json_or_discarded<nlohmann::json>(arguments);
    if (parsed.is_discarded() || !parsed.is_object() || name.empty()) return std::nullopt;
    calls.push_back(
        {fmt::format("{}{}", id_prefix, first_index + calls.size()), name, json_text(parsed)});
    at = end + kV3CallEnd.size();
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

std::optional<std::vector<ToolCall>> parse_dsml_calls(std::string_view body,
                                                      const std::string& id_prefix,
                                                      size_t first_index) {
  std::vector<ToolCall> calls;
  const std::string invoke_open = "<" + kDsmlMark, invoke_end = "</" + kDsmlMark + "invoke>",
                    invoke_end_spaced = "</" + kDsmlMark + " invoke>",
                    param_end = "</" + kDsmlMark + "parameter>",
                    param_end_spaced = "</" + kDsmlMark + " parameter>";
  size_t at = 0;
  while (true) {
    auto start = find_either(body, invoke_open + "invoke ", invoke_open + " invoke ", at);
    if (!start) break;
    size_t tag = start->first;
    size_t tag_end = body.find('>', tag);
    if (tag_end == std::string::npos) return std::nullopt;
    std::string_view invoke_tag = body.substr(tag, tag_end - tag);
    std::optional<std::string> name = attribute(invoke_tag, "name");
    auto close = find_either(body, invoke_end, invoke_end_spaced, tag_end);
    if (!name || !close) return std::nullopt;
    std::string_view inside = body.substr(tag_end + 1, close->first - tag_end - 1);
    nlohmann::json arguments = nlohmann::json::object();
    for (size_t p = 0; (p = inside.find(invoke_open, p)) != std::string::npos;) {
      size_t p_end = inside.find('>', p);
      auto value_end = find_either(inside, param_end, param_end_spaced, p_end);
      if (p_end == std::string::npos || !value_end) return std::nullopt;
      std::string_view param_tag = inside.substr(p, p_end - p);
      std::optional<std::string> key = attribute(param_tag, "name");
      if (!key) return std::nullopt;
      std::string value(inside.substr(p_end + 1, value_end->first - p_end - 1));
      auto parsed = parse_json_or_discarded<nlohmann::json>(value);
      bool raw = attribute(param_tag, "string").value_or("false") == "true";
      arguments[*key] = raw || parsed.is_discarded() ? nlohmann::json(value) : parsed;
      p = value_end->first + value_end->second;
    }
    calls.push_back(
        {fmt::format("{}{}", id_prefix, first_index + calls.size()), *name, json_text(arguments)});
    at = close->first + close->second;
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

OutputParser::OutputParser(OutputSyntax syntax, std::string id_prefix)
    : syntax_(std::move(syntax)),
      id_prefix_(std::move(id_prefix)),
      mode_(syntax_.starts_in_reasoning ? Mode::kReasoning : Mode::kContent) {}

void OutputParser::emit(ParsedOutput& out, Mode mode, std::string_view text) {
  if (mode == Mode::kContent && after_reasoning_) {
    // The answer's leading newlines (the template's separator after </think>) are dropped.
    while (!text.empty() && (text.front() == '\n' || text.front() == '\r')) text.remove_prefix(1);
    if (!text.empty()) after_reasoning_ = false;
  }
  if (text.empty()) return;
  std::string& target = mode == Mode::kReasoning ? out.reasoning : out.content;
  target.append(text);
  (mode == Mode::kReasoning ? total_.reasoning : total_.content).append(text);
}

// How many trailing bytes of `text` could be the start of a marker this mode looks for.
size_t OutputParser::held_back(std::string_view text) const {
  std::vector<const std::string*> markers;
  if (mode_ == Mode::kReasoning) markers = {&syntax_.reasoning_end};
  if (mode_ == Mode::kContent)
    markers = {&syntax_.reasoning_start, &syntax_.reasoning_end, &syntax_.tool_start};
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
  // Reasoning's trailing newlines wait: they are dropped if </think> follows.
  if (mode_ == Mode::kReasoning) {
    while (hold < text.size() && text[text.size() - hold - 1] == '\n') ++hold;
  }
  return hold;
}

// Drops the first `bytes` of the buffer, and the control spans that lay there.
void OutputParser::consume(size_t bytes) {
  buffer_.erase(0, bytes);
  std::vector<std::pair<size_t, size_t>> kept;
  for (auto [begin, end] : control_spans_)
    if (end > bytes) kept.emplace_back(begin > bytes ? begin - bytes : 0, end - bytes);
  control_spans_ = std::move(kept);
}

// The first occurrence of `marker` in the buffer that the model wrote as a marker: with
// control_markers, one holding a control token's text (so typed look-alikes stay text).
size_t OutputParser::find_marker(const std::string& marker) const {
  for (size_t at = buffer_.find(marker); at != std::string::npos;
       at = buffer_.find(marker, at + 1)) {
    if (!syntax_.control_markers) return at;
    for (auto [begin, end] : control_spans_)
      if (begin < at + marker.size() && at < end) return at;
  }
  return std::string::npos;
}

// Consumes the buffer up to the next marker; false when it needs more text.
bool OutputParser::step(ParsedOutput& out) {
  if (mode_ == Mode::kAfterCalls) {
    consume(buffer_.size());  // what follows a DSML block is not answer text
    return false;
  }
  if (mode_ == Mode::kToolCall && syntax_.tools == ToolFormat::kDsml) return step_dsml(out);
  if (mode_ == Mode::kToolCall && syntax_.tools == ToolFormat::kHermesJson) return step_hermes(out);
  if (mode_ == Mode::kToolCall) {
    size_t end = buffer_.find(syntax_.tool_end);
    if (end == std::string::npos) return false;
    std::string body = buffer_.substr(0, end);
    consume(end + syntax_.tool_end.size());
    mode_ = Mode::kContent;
    auto calls = parse_deepseek_v3_calls(body, id_prefix_, total_.tool_calls.size());
    if (!calls) {
      emit(out, Mode::kContent, syntax_.tool_start + body + syntax_.tool_end);
      return true;
    }
    for (ToolCall& call : *calls) add_call(out, std::move(call));
    return true;
  }
  const std::string& end_marker = syntax_.reasoning_end;
  size_t at = std::string::npos, marker_size = 0;
  Mode next = mode_;
  if (mode_ == Mode::kReasoning) {
    at = find_marker(end_marker);
    marker_size = end_marker.size();
    next = Mode::kContent;
    if (at != std::string::npos) {
      size_t text_end = at;
      while (text_end > 0 && buffer_[text_end - 1] == '\n') --text_end;
      emit(out, mode_, std::string_view(buffer_).substr(0, text_end));
      consume(at + marker_size);
      mode_ = next;
      after_reasoning_ = true;
      return true;
    }
  } else {
    // A stray </think> in the answer is dropped (the content mode stays).
    for (auto [marker, mode] : {std::pair{&syntax_.reasoning_start, Mode::kReasoning},
                                std::pair{&syntax_.reasoning_end, Mode::kContent},
                                std::pair{&syntax_.tool_start, Mode::kToolCall}}) {
      if (marker->empty()) continue;
      size_t found = find_marker(*marker);
      if (found < at) {
        at = found;
        marker_size = marker->size();
        next = mode;
      }
    }
  }
  if (at == std::string::npos) return false;
  emit(out, mode_, std::string_view(buffer_).substr(0, at));
  consume(at + marker_size);
  mode_ = next;
  return true;
}

// A call complete at once: one piece that opens and closes it.
void OutputParser::add_call(ParsedOutput& out, ToolCall call) {
  out.call_pieces.push_back(
      {total_.tool_calls.size(), call.id, call.name, call.arguments, true, true});
  out.tool_calls.push_back(call);
  total_.tool_calls.push_back(std::move(call));
}

// Inside "<tool_call>": once the name is known the call opens and its arguments stream as
// the model writes them; the block's end closes it. Blocks in another shape are parsed
// whole at their end.
bool OutputParser::step_hermes(ParsedOutput& out) {
  if (!open_call_) open_hermes_call(out);
  size_t end = buffer_.find(syntax_.tool_end);
  if (end == std::string::npos) {
    if (open_call_) stream_hermes_arguments(out);
    return false;
  }
  mode_ = Mode::kContent;
  if (open_call_) {
    close_hermes_call(out, end);
    return true;
  }
  std::string body = buffer_.substr(0, end);
  consume(end + syntax_.tool_end.size());
  auto call = parse_json_or_discarded<nlohmann::json>(body);
  if (call.is_discarded() || !call.is_object() || !call.contains("name") ||
      !call["name"].is_string()) {
    // Not a call after all: the model's text stays visible.
    emit(out, Mode::kContent, syntax_.tool_start + body + syntax_.tool_end);
    return true;
  }
  nlohmann::json arguments = call.value("arguments", nlohmann::json::object());
  if (arguments.is_string()) {
    auto parsed = parse_json_or_discarded<nlohmann::json>(arguments.get<std::string>());
    if (!parsed.is_discarded()) arguments = parsed;
  }
  add_call(out, {fmt::format("{}{}", id_prefix_, total_.tool_calls.size()),
                 call["name"].get<std::string>(), json_text(arguments)});
  return true;
}

// `{"name": "NAME", "arguments": ` at the start of the block opens the call.
void OutputParser::open_hermes_call(ParsedOutput& out) {
  size_t at = 0;
  auto skip_space = [&] {
    while (at < buffer_.size() && std::isspace(static_cast<unsigned char>(buffer_[at]))) ++at;
  };
  auto expect = [&](std::string_view text) {
    skip_space();
    if (buffer_.compare(at, text.size(), text) != 0) return false;
    at += text.size();
    return true;
  };
  if (!expect("{") || !expect("\"name\"") || !expect(":") || !expect("\"")) return;
  size_t name_end = buffer_.find('"', at);
  if (name_end == std::string::npos) return;
  std::string name = buffer_.substr(at, name_end - at);
  if (name.find('\\') != std::string::npos) return;  // escaped names: parsed whole
  at = name_end + 1;
  if (!expect(",") || !expect("\"arguments\"") || !expect(":")) return;
  skip_space();
  // Arguments as an object stream; anything else (a JSON string) is parsed whole.
  if (at == buffer_.size() || buffer_[at] != '{') return;
  open_call_ = ToolCall{fmt::format("{}{}", id_prefix_, total_.tool_calls.size()), name, ""};
  out.call_pieces.push_back({total_.tool_calls.size(), open_call_->id, name, "", true, false});
  consumed_block_ = buffer_.substr(0, at);
  consume(at);
}

// Streams the arguments written so far, holding back what may be the block's end: trailing
// whitespace, the object's closing brace and the start of </tool_call>.
void OutputParser::stream_hermes_arguments(ParsedOutput& out) {
  size_t safe = buffer_.size();
  const std::string& end_tag = syntax_.tool_end;
  for (size_t length = std::min(end_tag.size() - 1, buffer_.size()); length > 0; --length) {
    if (buffer_.compare(buffer_.size() - length, length, end_tag, 0, length) == 0) {
      safe -= length;
      break;
    }
  }
  auto back_over_space = [&] {
    while (safe > 0 && std::isspace(static_cast<unsigned char>(buffer_[safe - 1]))) --safe;
  };
  back_over_space();
  if (safe > 0 && buffer_[safe - 1] == '}') --safe;
  back_over_space();
  if (safe == 0) return;
  std::string piece = buffer_.substr(0, safe);
  open_call_->arguments += piece;
  consumed_block_ += piece;
  consume(safe);
  out.call_pieces.push_back({total_.tool_calls.size(), "", "", piece, false, false});
}

// The block ended at `end`: what is left of the arguments, without the object's close.
void OutputParser::close_hermes_call(ParsedOutput& out, size_t end) {
  std::string rest = buffer_.substr(0, end);
  consume(end + syntax_.tool_end.size());
  while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.back()))) rest.pop_back();
  if (!rest.empty() && rest.back() == '}') rest.pop_back();
  while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.back()))) rest.pop_back();
  ToolCall call = std::move(*open_call_);
  open_call_.reset();
  consumed_block_.clear();
  call.arguments += rest;
  out.call_pieces.push_back({total_.tool_calls.size(), "", "", rest, false, true});
  out.tool_calls.push_back(call);
  total_.tool_calls.push_back(std::move(call));
}

// Inside "<｜DSML｜...": complete once the block's closing tag (either spelling) arrived.
bool OutputParser::step_dsml(ParsedOutput& out) {
  auto close = find_either(buffer_, "</" + kDsmlMark + "tool_calls>", "</" + kDsmlMark + " calls>");
  if (!close) return false;
  std::string body = buffer_.substr(0, close->first);
  consume(close->first + close->second);
  std::optional<std::vector<ToolCall>> calls =
      parse_dsml_calls(kDsmlOpen + body, id_prefix_, total_.tool_calls.size());
  if (!calls) {
    emit(out, Mode::kContent, kDsmlOpen + body + "</" + kDsmlMark + "tool_calls>");
    mode_ = Mode::kContent;
    return true;
  }
  for (ToolCall& call : *calls) add_call(out, std::move(call));
  mode_ = Mode::kAfterCalls;
  return true;
}

ParsedOutput OutputParser::push(std::string_view text, size_t control_from) {
  ParsedOutput out;
  if (control_from < text.size())
    control_spans_.emplace_back(buffer_.size() + control_from, buffer_.size() + text.size());
  buffer_.append(text);
  while (step(out)) {
  }
  if (mode_ != Mode::kToolCall && mode_ != Mode::kAfterCalls) {
    size_t keep = held_back(buffer_);
    emit(out, mode_, std::string_view(buffer_).substr(0, buffer_.size() - keep));
    consume(buffer_.size() - keep);
  }
  return out;
}

ParsedOutput OutputParser::finish() {
  ParsedOutput out;
  if (mode_ == Mode::kAfterCalls) {
    consume(buffer_.size());
  } else if (mode_ == Mode::kToolCall) {
    // An unfinished call is text; a streamed one is closed where it stopped.
    if (open_call_) out.call_pieces.push_back({total_.tool_calls.size(), "", "", "", false, true});
    emit(out, Mode::kContent, syntax_.tool_start + consumed_block_ + buffer_);
    open_call_.reset();
    consumed_block_.clear();
  } else {
    emit(out, mode_, buffer_);
  }
  consume(buffer_.size());
  mode_ = Mode::kContent;
  return out;
}

}  // namespace deepinfer::protocol

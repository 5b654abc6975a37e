// Splits generated text into reasoning, visible content and tool calls while it streams, for
// models that mark them with tags: <think>...</think> reasoning (Qwen3, DeepSeek-R1 style)
// and Hermes/Qwen <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks. Markers may
// arrive split across any chunks: text that could still be the start of a marker is held
// back until it is known.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace deepinfer::protocol {

// How tool calls are written: Hermes/Qwen JSON in <tool_call> tags, or DeepSeek V4's DSML
// (<｜DSML｜tool_calls> with invoke and parameter tags; V4.1 writes "<｜DSML｜ calls>" and a
// space after ｜DSML｜ in every tag). Text after a DSML block is not answer text.
// DeepSeek V3 wraps calls in <｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>, each
// <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜> (V3.1
// drops the "function" and the fence: NAME<｜tool▁sep｜>ARGS).
enum class ToolFormat { kNone, kHermesJson, kDsml, kDeepSeekV3 };

struct OutputSyntax {
  std::string reasoning_start, reasoning_end;  // empty: the model does not reason in tags
  bool starts_in_reasoning = false;            // the prompt already opened the reasoning
  ToolFormat tools = ToolFormat::kNone;
  std::string tool_start, tool_end;  // the block's tags (DSML: the common prefix; ends vary)
  // The opening markers and </think> count only where a control token wrote them (push's
  // control_from); the same characters as ordinary tokens are text.
  bool control_markers = false;
  bool any() const { return !reasoning_end.empty() || tools != ToolFormat::kNone; }
};

// The calls in the body of a DeepSeek V3 block (between its begin and end tokens); nullopt
// when malformed.
std::optional<std::vector<struct ToolCall>> parse_deepseek_v3_calls(std::string_view body,
                                                                    const std::string& id_prefix,
                                                                    size_t first_index);

// The calls in the body of a DSML block (the text after "<｜DSML｜" up to its closing tag);
// nullopt when it is not a well-formed block.
std::optional<std::vector<struct ToolCall>> parse_dsml_calls(std::string_view body,
                                                             const std::string& id_prefix,
                                                             size_t first_index);

// The tags a model uses, from its vocabulary's added tokens ("<think>", "<tool_call>").
OutputSyntax detect_output_syntax(const Tokenizer& tokenizer);

struct ToolCall {
  std::string id;  // "call_<n>" unique within the response
  std::string name;
  std::string arguments;  // a JSON object, as text
};

// A streamed piece of a tool call: the piece that `opens` call `index` carries its id and
// name; every piece may add to its arguments; the piece that `closes` it ends it.
struct ToolCallPiece {
  size_t index = 0;
  std::string id, name;
  std::string arguments;
  bool opens = false, closes = false;
};

struct ParsedOutput {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;  // calls complete in this piece
  // For streaming: Hermes/Qwen calls as their arguments arrive, other formats one piece per
  // call once complete. Concatenated, a call's pieces give its ToolCall.
  std::vector<ToolCallPiece> call_pieces;
  bool empty() const {
    return reasoning.empty() && content.empty() && tool_calls.empty() && call_pieces.empty();
  }
};

class OutputParser {
 public:
  OutputParser(OutputSyntax syntax, std::string id_prefix);
  // What became final with this text; its bytes from `control_from` on were written by a
  // control (added-vocabulary) token.
  ParsedOutput push(std::string_view text, size_t control_from = std::string_view::npos);
  // At the end: what was held back (an unfinished tool call stays visible as content).
  ParsedOutput finish();
  // Call ids are this prefix and a running number (set before the first call completes).
  void set_id_prefix(std::string prefix) { id_prefix_ = std::move(prefix); }
  // Everything so far, accumulated.
  const ParsedOutput& total() const { return total_; }

 private:
  enum class Mode { kContent, kReasoning, kToolCall, kAfterCalls };
  void emit(ParsedOutput& out, Mode mode, std::string_view text);
  bool step(ParsedOutput& out);
  bool step_dsml(ParsedOutput& out);
  bool step_hermes(ParsedOutput& out);
  void open_hermes_call(ParsedOutput& out);
  void stream_hermes_arguments(ParsedOutput& out);
  void close_hermes_call(ParsedOutput& out, size_t end);
  void add_call(ParsedOutput& out, ToolCall call);
  size_t held_back(std::string_view text) const;
  void consume(size_t bytes);
  size_t find_marker(const std::string& marker) const;

  OutputSyntax syntax_;
  std::string id_prefix_;
  Mode mode_;
  std::string buffer_;
  std::vector<std::pair<size_t, size_t>> control_spans_;  // byte ranges of buffer_
  ParsedOutput total_;
  bool after_reasoning_ = false;  // the answer has not started since </think>
  // A Hermes call whose name arrived: its arguments so far, and the block text consumed.
  std::optional<ToolCall> open_call_;
  std::string consumed_block_;
};

}  // namespace deepinfer::protocol

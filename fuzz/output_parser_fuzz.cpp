// Model output read back into reasoning, content and tool calls, as it streams. The first byte
// picks the syntax (tool format, reasoning tags, whether the prompt opened the reasoning,
// whether markers count only from control tokens); the rest is the output, cut into pushes
// at every 0x01 byte, with 0x02 marking where a push's control-token bytes begin. Beyond
// not crashing, the streamed pieces of each call must add up to the call.
#include <map>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "protocol/output_parser.h"

namespace {

using namespace deepinfer::protocol;

OutputSyntax syntax_from(uint8_t bits) {
  OutputSyntax syntax;
  if (bits & 0x04) {
    syntax.reasoning_start = "<think>";
    syntax.reasoning_end = "</think>";
  }
  syntax.starts_in_reasoning = (bits & 0x08) != 0 && (bits & 0x04) != 0;
  syntax.control_markers = (bits & 0x10) != 0;
  switch (bits & 0x03) {
    case 1:
      syntax.tools = ToolFormat::kHermesJson;
      syntax.tool_start = "<tool_call>";
      syntax.tool_end = "</tool_call>";
      break;
    case 2:
      syntax.tools = ToolFormat::kDsml;
      syntax.tool_start =
          "<\xEF\xBD\x9C"
          "DSML\xEF\xBD\x9C";
      break;
    case 3:
      syntax.tools = ToolFormat::kDeepSeekV3;
      syntax.tool_start = "<｜tool▁calls▁begin｜>";
      syntax.tool_end = "<｜tool▁calls▁end｜>";
      break;
    default:
      break;
  }
  return syntax;
}

// Pieces of each call by index, and the calls completed.
struct Collected {
  std::map<size_t, ToolCallPiece> pieces;
  std::vector<ToolCall> calls;
  void add(const ParsedOutput& out) {
    for (const ToolCallPiece& piece : out.call_pieces) {
      ToolCallPiece& sum = pieces[piece.index];
      if (piece.opens) {
        sum.id = piece.id;
        sum.name = piece.name;
        sum.opens = true;
      }
      sum.arguments += piece.arguments;
      sum.closes = sum.closes || piece.closes;
    }
    calls.insert(calls.end(), out.tool_calls.begin(), out.tool_calls.end());
  }
};

void check_pieces_add_up(const Collected& collected) {
  for (size_t index = 0; index < collected.calls.size(); ++index) {
    const ToolCall& call = collected.calls[index];
    auto found = collected.pieces.find(index);
    if (found == collected.pieces.end()) continue;  // formats that stream no pieces
    const ToolCallPiece& sum = found->second;
    if (!sum.closes) continue;
    if (sum.name != call.name || sum.id != call.id || sum.arguments != call.arguments) {
      std::fprintf(stderr, "call %zu streamed as %s(%s), completed as %s(%s)\n", index,
                   sum.name.c_str(), sum.arguments.c_str(), call.name.c_str(),
                   call.arguments.c_str());
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  OutputParser parser(syntax_from(data[0]), "call_");
  Collected collected;
  std::string_view rest = deepinfer::fuzz::as_text(data + 1, size - 1);
  while (true) {
    size_t cut = rest.find('\x01');
    std::string push(rest.substr(0, cut));
    size_t control_from = push.find('\x02');
    if (control_from != std::string::npos) push.erase(control_from, 1);
    deepinfer::fuzz::expect_clean([&] { collected.add(parser.push(push, control_from)); });
    if (cut == std::string_view::npos) break;
    rest.remove_prefix(cut + 1);
  }
  deepinfer::fuzz::expect_clean([&] { collected.add(parser.finish()); });
  check_pieces_add_up(collected);
  return 0;
}

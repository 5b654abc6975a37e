// Reasoning and tool calls parsed out of generated text, whole and split at every byte.
#include "protocol/output_parser.h"

#include <gtest/gtest.h>

#include "protocol/completion_text.h"
#include "protocol/formatter.h"

namespace deepinfer::protocol {
namespace {

OutputSyntax qwen_syntax(bool starts_in_reasoning = false) {
  OutputSyntax syntax;
  syntax.reasoning_start = "<think>";
  syntax.reasoning_end = "</think>";
  syntax.starts_in_reasoning = starts_in_reasoning;
  syntax.tools = ToolFormat::kHermesJson;
  syntax.tool_start = "<tool_call>";
  syntax.tool_end = "</tool_call>";
  return syntax;
}

// A parsed piece as the parser gives it, calls complete at once.
ParsedOutput piece(std::string reasoning, std::string content, std::vector<ToolCall> calls = {}) {
  ParsedOutput out;
  out.reasoning = std::move(reasoning);
  out.content = std::move(content);
  for (size_t i = 0; i < calls.size(); ++i)
    out.call_pieces.push_back({i, calls[i].id, calls[i].name, calls[i].arguments, true, true});
  out.tool_calls = std::move(calls);
  return out;
}

// Every call's streamed pieces: one opens it with its id and name, one closes it, and
// their arguments concatenate to the call's.
void expect_pieces_match_calls(const ParsedOutput& all) {
  for (size_t i = 0; i < all.tool_calls.size(); ++i) {
    std::string arguments;
    int opens = 0, closes = 0;
    for (const ToolCallPiece& piece : all.call_pieces) {
      if (piece.index != i) continue;
      arguments += piece.arguments;
      opens += piece.opens;
      closes += piece.closes;
      if (piece.opens) {
        EXPECT_EQ(piece.name, all.tool_calls[i].name);
      }
    }
    EXPECT_EQ(opens, 1);
    EXPECT_EQ(closes, 1);
    EXPECT_EQ(arguments, all.tool_calls[i].arguments);
  }
}

// Feeds `text` in pieces split at `cuts`, collecting every delta.
ParsedOutput run_pieces(const OutputSyntax& syntax, const std::string& text,
                        const std::vector<size_t>& cuts) {
  OutputParser parser(syntax, "call_");
  ParsedOutput all;
  auto add = [&](const ParsedOutput& part) {
    all.reasoning += part.reasoning;
    all.content += part.content;
    for (const ToolCall& call : part.tool_calls) all.tool_calls.push_back(call);
    for (const ToolCallPiece& call : part.call_pieces) all.call_pieces.push_back(call);
  };
  size_t from = 0;
  for (size_t cut : cuts) {
    add(parser.push(text.substr(from, cut - from)));
    from = cut;
  }
  add(parser.push(text.substr(from)));
  add(parser.finish());
  expect_pieces_match_calls(all);
  return all;
}

ParsedOutput run(const OutputSyntax& syntax, const std::string& text, size_t cut) {
  return run_pieces(syntax, text, {cut});
}

TEST(OutputParser, ReasoningContentAndToolCallsAtEverySplit) {
  const std::string text =
      "<think>I should call run.</think>Let me run it.\n<tool_call>\n{\"name\": \"run\", "
      "\"arguments\": {\"code\": \"print(1)\"}}\n</tool_call>";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ParsedOutput out = run(qwen_syntax(), text, cut);
    EXPECT_EQ(out.reasoning, "I should call run.") << cut;
    EXPECT_EQ(out.content, "Let me run it.\n") << cut;
    ASSERT_EQ(out.tool_calls.size(), 1u) << cut;
    EXPECT_EQ(out.tool_calls[0].name, "run");
    EXPECT_EQ(out.tool_calls[0].arguments, R"j({"code": "print(1)"})j");  // as written
    EXPECT_EQ(out.tool_calls[0].id, "call_0");
  }
}

// Hermes arguments stream as they are written, byte by byte here: the call opens once its
// name is known, and nothing of the block's end leaks into the arguments.
TEST(OutputParser, HermesArgumentsStreamAsWritten) {
  const std::string text =
      "<tool_call>\n{\"name\": \"write\", \"arguments\": {\"path\": \"a.py\", \"text\": "
      "\"x = {}\\n\"}}\n</tool_call>after";
  std::vector<size_t> every_byte;
  for (size_t i = 1; i < text.size(); ++i) every_byte.push_back(i);
  ParsedOutput out = run_pieces(qwen_syntax(), text, every_byte);
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].arguments, R"({"path": "a.py", "text": "x = {}\n"})");
  EXPECT_GT(out.call_pieces.size(), 10u);  // it streamed
  EXPECT_EQ(out.content, "after");
  // An unfinished call is closed for the stream and stays text for the whole answer.
  every_byte.resize(59);
  ParsedOutput cut = run_pieces(qwen_syntax(), text.substr(0, 60), every_byte);
  EXPECT_TRUE(cut.tool_calls.empty());
  EXPECT_EQ(cut.content, text.substr(0, 60));
  ASSERT_FALSE(cut.call_pieces.empty());
  EXPECT_TRUE(cut.call_pieces.back().closes);
}

// Newlines around </think> belong to neither part; a stray </think> in the answer goes.
TEST(OutputParser, NewlinesAroundTheReasoningEndAndStrayEndsAreDropped) {
  const std::string text = "<think>\nplan\n\n</think>\n\nanswer</think> more\n";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ParsedOutput all = run(qwen_syntax(), text, cut);
    EXPECT_EQ(all.reasoning, "\nplan") << cut;
    EXPECT_EQ(all.content, "answer more\n") << cut;
  }
}

// Stop strings end the answer, never the reasoning or a tool call's arguments.
TEST(CompletionText, StopStringsApplyToTheAnswerOnly) {
  auto tokenizer = Tokenizer::load(std::string(DEEPINFER_TOKENIZERS) + "/qwen3");
  const std::string text =
      "<think>never STOP thinking</think>Done. <tool_call>{\"name\": \"f\", \"arguments\": "
      "{\"x\": \"STOP\"}}</tool_call>Then STOP here, not later";
  CompletionText completion(tokenizer.get(), {"STOP"}, OutputParser(qwen_syntax(), "call_"));
  ParsedOutput streamed;
  for (int32_t id : tokenizer->encode(text)) {
    ParsedOutput piece = completion.push(id);
    streamed.reasoning += piece.reasoning;
    streamed.content += piece.content;
  }
  completion.finish();
  EXPECT_TRUE(completion.stopped());
  EXPECT_EQ(completion.total().reasoning, "never STOP thinking");
  EXPECT_EQ(completion.total().content, "Done. Then ");
  EXPECT_EQ(streamed.content, completion.total().content);
  ASSERT_EQ(completion.total().tool_calls.size(), 1u);
  EXPECT_EQ(completion.total().tool_calls[0].arguments, R"({"x": "STOP"})");
}

// Markers count where a control token wrote them: the model spelling "<tool_call>" or
// "</think>" with ordinary tokens writes text.
TEST(CompletionText, MarkersAreDecidedByTokenIds) {
  auto tokenizer = Tokenizer::load(std::string(DEEPINFER_TOKENIZERS) + "/qwen3");
  OutputSyntax syntax = detect_output_syntax(*tokenizer);
  ASSERT_TRUE(syntax.control_markers);
  syntax.starts_in_reasoning = true;
  const std::string call = R"({"name": "f", "arguments": {}})";
  std::vector<int32_t> ids;
  auto add = [&](std::vector<int32_t> more) { ids.insert(ids.end(), more.begin(), more.end()); };
  add(tokenizer->encode("thinking about </think> as text", EncodeMode::kPlain));
  add({*tokenizer->token_to_id("</think>")});
  add(tokenizer->encode("typed: <tool_call>" + call + "</tool_call> real: ", EncodeMode::kPlain));
  add({*tokenizer->token_to_id("<tool_call>")});
  add(tokenizer->encode(call, EncodeMode::kPlain));
  add({*tokenizer->token_to_id("</tool_call>")});
  CompletionText completion(tokenizer.get(), {}, OutputParser(syntax, "call_"));
  for (int32_t id : ids) completion.push(id);
  completion.finish();
  EXPECT_EQ(completion.total().reasoning, "thinking about </think> as text");
  EXPECT_EQ(completion.total().content, "typed: <tool_call>" + call + "</tool_call> real: ");
  ASSERT_EQ(completion.total().tool_calls.size(), 1u);
  EXPECT_EQ(completion.total().tool_calls[0].name, "f");
}

TEST(OutputParser, PromptOpenedReasoningAndTwoCalls) {
  const std::string text =
      "thinking</think><tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>"
      "<tool_call>{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ParsedOutput out = run(qwen_syntax(true), text, cut);
    EXPECT_EQ(out.reasoning, "thinking");
    EXPECT_EQ(out.content, "");
    ASSERT_EQ(out.tool_calls.size(), 2u) << cut;
    EXPECT_EQ(out.tool_calls[1].name, "b");
    EXPECT_EQ(out.tool_calls[1].arguments, R"({"x":1})");  // string arguments are decoded
    EXPECT_EQ(out.tool_calls[1].id, "call_1");
  }
}

TEST(OutputParser, BrokenOrUnfinishedCallsStayVisibleAndNearMissesAreText) {
  ParsedOutput broken = run(qwen_syntax(), "a<tool_call>not json</tool_call>b", 3);
  EXPECT_EQ(broken.content, "a<tool_call>not json</tool_call>b");
  EXPECT_TRUE(broken.tool_calls.empty());
  ParsedOutput unfinished = run(qwen_syntax(), "x<tool_call>{\"name\": \"a\"", 5);
  EXPECT_EQ(unfinished.content, "x<tool_call>{\"name\": \"a\"");
  ParsedOutput near = run(qwen_syntax(), "a <thin b <tool c", 4);
  EXPECT_EQ(near.content, "a <thin b <tool c");
  OutputSyntax none;
  EXPECT_EQ(run(none, "<think>x</think>", 3).content, "<think>x</think>");
}

// "event: NAME\ndata: JSON\n\n" records of a stream, in order.
std::vector<std::pair<std::string, Json>> named_events(const std::string& stream) {
  std::vector<std::pair<std::string, Json>> events;
  for (size_t at = 0; (at = stream.find("event: ", at)) != std::string::npos;) {
    size_t data = stream.find("\ndata: ", at);
    size_t end = stream.find("\n\n", data);
    events.emplace_back(stream.substr(at + 7, data - at - 7),
                        Json::parse(stream.substr(data + 7, end - data - 7)));
    at = end;
  }
  return events;
}

OutputSyntax dsml_syntax() {
  OutputSyntax syntax;
  syntax.reasoning_start = "<think>";
  syntax.reasoning_end = "</think>";
  syntax.starts_in_reasoning = true;
  syntax.tools = ToolFormat::kDsml;
  syntax.tool_start = "<\uFF5CDSML\uFF5C";
  return syntax;
}

// DeepSeek V4 and V4.1 DSML blocks: raw-string and JSON parameters, several invokes, split at
// every byte; text after the block is dropped.
TEST(OutputParser, DsmlToolCallsInBothSpellingsAtEverySplit) {
  const std::string v4 =
      "plan</think>Checking.\n\n<\uFF5CDSML\uFF5Ctool_calls>\n"
      "<\uFF5CDSML\uFF5Cinvoke name=\"get_weather\">\n"
      "<\uFF5CDSML\uFF5Cparameter name=\"city\" string=\"true\">Paris</\uFF5CDSML\uFF5Cparameter>\n"
      "<\uFF5CDSML\uFF5Cparameter name=\"days\" string=\"false\">3</\uFF5CDSML\uFF5Cparameter>\n"
      "</\uFF5CDSML\uFF5Cinvoke>\n"
      "<\uFF5CDSML\uFF5Cinvoke name=\"ns::list\">\n</\uFF5CDSML\uFF5Cinvoke>\n"
      "</\uFF5CDSML\uFF5Ctool_calls>ignored";
  std::string v41 = v4;
  for (const char* tag : {"tool_calls>", "invoke", "parameter"}) {
    std::string from = std::string("\uFF5C") + tag, to = std::string("\uFF5C ") + tag;
    for (size_t at = 0; (at = v41.find(from, at)) != std::string::npos; at += to.size())
      v41.replace(at, from.size(), to);
  }
  for (size_t at = 0; (at = v41.find("\uFF5C tool_calls>")) != std::string::npos;)
    v41.replace(at, std::string("\uFF5C tool_calls>").size(), "\uFF5C calls>");
  for (const std::string& text : {v4, v41}) {
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      ParsedOutput out = run(dsml_syntax(), text, cut);
      EXPECT_EQ(out.reasoning, "plan") << cut;
      EXPECT_EQ(out.content, "Checking.\n\n") << cut;
      ASSERT_EQ(out.tool_calls.size(), 2u) << cut << " " << text;
      EXPECT_EQ(out.tool_calls[0].name, "get_weather");
      EXPECT_EQ(out.tool_calls[0].arguments, R"j({"city":"Paris","days":3})j");
      EXPECT_EQ(out.tool_calls[1].name, "ns::list");
      EXPECT_EQ(out.tool_calls[1].arguments, "{}");
    }
  }
}

// Bytes that are not UTF-8 inside a call's names or values (a model can emit any byte token)
// become U+FFFD in the arguments' JSON; serializing them once threw out of the parser.
TEST(OutputParser, InvalidUtf8InsideToolCallsIsReplacedNotThrown) {
  const std::string text =
      "</think><\uFF5CDSML\uFF5Ctool_calls>\n<\uFF5CDSML\uFF5Cinvoke name=\"f\">\n"
      "<\uFF5CDSML\uFF5Cparameter name=\"\xa0x\" "
      "string=\"true\">v\xff</\uFF5CDSML\uFF5Cparameter>\n"
      "</\uFF5CDSML\uFF5Cinvoke>\n</\uFF5CDSML\uFF5Ctool_calls>";
  ParsedOutput out = run(dsml_syntax(), text, text.size());
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].arguments, "{\"\uFFFDx\":\"v\uFFFD\"}");
}

// DeepSeek V3's call blocks (the V3 fence form and the V3.1 bare form) at every split; the
// syntax is detected from the real V3 vocabulary.
TEST(OutputParser, DeepSeekV3ToolCallsAtEverySplit) {
  auto tokenizer = Tokenizer::load(std::string(DEEPINFER_TOKENIZERS) + "/deepseek_v3");
  OutputSyntax syntax = detect_output_syntax(*tokenizer);
  syntax.control_markers = false;  // the text below is pushed without its token ids
  ASSERT_EQ(syntax.tools, ToolFormat::kDeepSeekV3);
  const std::string text =
      "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
      "```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>lookup"
      "<｜tool▁sep｜>{\"q\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ParsedOutput out = run(syntax, text, cut);
    EXPECT_EQ(out.content, "Sure.") << cut;
    ASSERT_EQ(out.tool_calls.size(), 2u) << cut;
    EXPECT_EQ(out.tool_calls[0].name, "get_weather");
    EXPECT_EQ(out.tool_calls[0].arguments, R"j({"city":"Paris"})j");
    EXPECT_EQ(out.tool_calls[1].name, "lookup");
    EXPECT_EQ(out.tool_calls[1].arguments, R"j({"q":1})j");
  }
}

// Parsed output in the chat API's shapes: reasoning_content, tool_calls with JSON-string
// arguments, content null beside tool calls; stream deltas index their tool calls.
TEST(ChatFormat, ReasoningAndToolCallsWholeAndStreamed) {
  ChoiceOutput choice;
  choice.reasoning = "why";
  choice.tool_calls = {{"call_a_0", "run", R"j({"code":"x"})j"}};
  choice.finish_reason = "tool_calls";
  Usage usage{5, 7, 0};
  auto formatter = make_formatter(ApiFormat::kChatCompletions, {"chatcmpl-1", "m", 1, 5, false});
  Json whole = formatter->whole({choice}, usage);
  const Json& message = whole["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "why");
  EXPECT_TRUE(message["content"].is_null());
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "run");
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], R"j({"code":"x"})j");
  EXPECT_EQ(message["tool_calls"][0]["type"], "function");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");

  ParsedOutput first = piece("why", "");
  ParsedOutput second = piece("", "", {{"call_a_0", "run", "{}"}, {"call_a_1", "ls", "{}"}});
  std::string stream = formatter->stream_parsed(0, first);
  stream += formatter->stream_parsed(0, second);
  size_t second_event = stream.find("data: ", 6);
  Json one = Json::parse(stream.substr(6, second_event - 8));
  Json two = Json::parse(stream.substr(second_event + 6));
  EXPECT_EQ(one["choices"][0]["delta"]["reasoning_content"], "why");
  EXPECT_EQ(one["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(two["choices"][0]["delta"]["tool_calls"][1]["index"], 1);
  EXPECT_EQ(two["choices"][0]["delta"]["tool_calls"][1]["function"]["name"], "ls");
}

// The same in Anthropic's shapes: thinking, text and tool_use blocks in order, each stream
// block opened, filled and closed with consecutive indexes; stop_reason tool_use.
TEST(AnthropicFormat, ThinkingTextAndToolUseBlocks) {
  ChoiceOutput choice;
  choice.reasoning = "why";
  choice.text = "Running it.";
  choice.tool_calls = {{"call_0", "run", R"j({"code":"x"})j"}};
  choice.finish_reason = "stop";
  auto formatter = make_formatter(ApiFormat::kAnthropicMessages, {"msg_1", "m", 1, 5, false});
  Json whole = formatter->whole({choice}, Usage{5, 7, 0});
  ASSERT_EQ(whole["content"].size(), 3u);
  EXPECT_EQ(whole["content"][0]["type"], "thinking");
  EXPECT_EQ(whole["content"][1]["text"], "Running it.");
  EXPECT_EQ(whole["content"][2]["type"], "tool_use");
  EXPECT_EQ(whole["content"][2]["input"]["code"], "x");
  EXPECT_EQ(whole["stop_reason"], "tool_use");

  std::string stream = formatter->stream_start();
  stream += formatter->stream_parsed(0, piece("why", ""));
  stream += formatter->stream_parsed(0, piece("", "Running it."));
  stream += formatter->stream_parsed(0, piece("", "", choice.tool_calls));
  stream += formatter->stream_finish(choice, "");
  stream += formatter->stream_end(Usage{5, 7, 0});
  std::vector<std::pair<std::string, Json>> events = named_events(stream);
  std::vector<std::string> names;
  for (const auto& [name, payload] : events) {
    names.push_back(name);
    EXPECT_EQ(payload["type"], name);  // the event line always matches the payload's type
  }
  std::vector<std::string> expected = {"message_start",       "ping",
                                       "content_block_start", "content_block_delta",
                                       "content_block_stop",  // thinking, 0
                                       "content_block_start", "content_block_delta",
                                       "content_block_stop",  // text, 1
                                       "content_block_start", "content_block_delta",
                                       "content_block_stop",  // tool_use, 2
                                       "message_delta",       "message_stop"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(events[8].second["index"], 2);
  EXPECT_EQ(events[8].second["content_block"]["type"], "tool_use");
  EXPECT_EQ(events[9].second["delta"]["type"], "input_json_delta");
  EXPECT_EQ(events[11].second["delta"]["stop_reason"], "tool_use");
}

// And in the Responses API's: reasoning, message and function_call items, whole and as typed
// events that open, fill and close each item at its output_index.
TEST(ResponsesFormat, ReasoningMessageAndFunctionCallItems) {
  ChoiceOutput choice;
  choice.reasoning = "why";
  choice.text = "ok";
  choice.tool_calls = {{"call_0", "run", R"j({"code":"x"})j"}};
  choice.finish_reason = "tool_calls";
  auto formatter = make_formatter(ApiFormat::kResponses, {"resp_1", "m", 1, 5, false});
  Json whole = formatter->whole({choice}, Usage{5, 7, 0});
  ASSERT_EQ(whole["output"].size(), 3u);
  EXPECT_EQ(whole["output"][0]["type"], "reasoning");
  EXPECT_EQ(whole["output"][0]["content"][0]["text"], "why");
  EXPECT_EQ(whole["output"][1]["content"][0]["text"], "ok");
  EXPECT_EQ(whole["output"][2]["type"], "function_call");
  EXPECT_EQ(whole["output"][2]["call_id"], "call_0");
  EXPECT_EQ(whole["output"][2]["arguments"], R"j({"code":"x"})j");

  auto streamer = make_formatter(ApiFormat::kResponses, {"resp_1", "m", 1, 5, false});
  std::string stream = streamer->stream_start();
  stream += streamer->stream_parsed(0, piece("why", ""));
  stream += streamer->stream_parsed(0, piece("", "ok"));
  stream += streamer->stream_parsed(0, piece("", "", choice.tool_calls));
  stream += streamer->stream_finish(choice, "");
  stream += streamer->stream_end(Usage{5, 7, 0});
  std::vector<std::string> names;
  Json completed;
  int64_t sequence = 0;
  for (const auto& [name, payload] : named_events(stream)) {
    names.push_back(payload["type"]);
    EXPECT_EQ(payload["sequence_number"], sequence++);
    if (payload["type"] == "response.completed") completed = payload["response"];
  }
  std::vector<std::string> expected = {"response.created",
                                       "response.in_progress",
                                       "response.output_item.added",
                                       "response.reasoning_text.delta",
                                       "response.reasoning_text.done",
                                       "response.output_item.done",
                                       "response.output_item.added",
                                       "response.content_part.added",
                                       "response.output_text.delta",
                                       "response.output_text.done",
                                       "response.content_part.done",
                                       "response.output_item.done",
                                       "response.output_item.added",
                                       "response.function_call_arguments.delta",
                                       "response.function_call_arguments.done",
                                       "response.output_item.done",
                                       "response.completed"};
  EXPECT_EQ(names, expected);
  ASSERT_EQ(completed["output"].size(), 3u);
  EXPECT_EQ(completed["output"][2]["name"], "run");
}

}  // namespace
}  // namespace deepinfer::protocol

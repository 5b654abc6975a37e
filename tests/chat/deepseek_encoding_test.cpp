// DeepSeek V4 / V4.1 prompts rendered as docs/specs/deepseek-encoding.md describes them.
#include "chat/deepseek_encoding.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"

namespace deepinfer::chat {
namespace {

using Json = nlohmann::ordered_json;
using testing::HasSubstr;
using testing::StartsWith;

const std::string kBos = "<｜begin▁of▁sentence｜>";

ChatRequest conversation(Json messages) {
  ChatRequest request;
  request.messages = std::move(messages);
  request.add_generation_prompt = true;
  return request;
}

SegmentedPrompt render(DeepSeekEncoding version, const ChatRequest& request) {
  DeepSeekPromptOptions options;
  options.version = version;
  return render_deepseek_prompt(options, request);
}

TEST(DeepSeekEncoding, SpecExampleWithoutThinking) {
  ChatRequest request =
      conversation(Json::array({{{"role", "user"}, {"content", "Reply exactly: OK"}}}));
  SegmentedPrompt v4 = render(DeepSeekEncoding::kV4, request);
  EXPECT_EQ(v4.text, kBos + "<｜User｜>Reply exactly: OK<｜Assistant｜></think>");
  // The user's text is the one client range.
  ASSERT_EQ(v4.content.size(), 1u);
  EXPECT_EQ(v4.text.substr(v4.content[0].first, v4.content[0].second - v4.content[0].first),
            "Reply exactly: OK");
  EXPECT_EQ(render(DeepSeekEncoding::kV41, request).text, v4.text);
}

TEST(DeepSeekEncoding, ThinkingModeAndReasoningEffort) {
  ChatRequest request = conversation(Json::array(
      {{{"role", "system"}, {"content", "Be terse."}}, {{"role", "user"}, {"content", "Hi"}}}));
  request.variables["thinking"] = true;
  const std::string effort_75 =
      "Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the "
      "reasoning)\n\n";
  EXPECT_EQ(render(DeepSeekEncoding::kV41, request).text,
            kBos + "<｜System｜>" + effort_75 + "Be terse.<｜User｜>Hi<｜Assistant｜><think>");
  request.variables["reasoning_effort"] = 30;
  EXPECT_THAT(render(DeepSeekEncoding::kV41, request).text, HasSubstr("Reasoning Effort: 30 ("));
  request.variables["reasoning_effort"] = "low";
  EXPECT_THAT(render(DeepSeekEncoding::kV41, request).text, HasSubstr("Reasoning Effort: 50 ("));
  request.variables["reasoning_effort"] = 101;
  EXPECT_THROW(render(DeepSeekEncoding::kV41, request), Error);
  // V4: system text right after BOS; only levels with a configured sentence write one.
  request.variables["reasoning_effort"] = "high";
  EXPECT_EQ(render(DeepSeekEncoding::kV4, request).text,
            kBos + "Be terse.<｜User｜>Hi<｜Assistant｜><think>");
  request.variables["reasoning_effort"] = "max";
  EXPECT_EQ(render(DeepSeekEncoding::kV4, request).text,
            kBos + "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n\nBe terse." +
                "<｜User｜>Hi<｜Assistant｜><think>");
  // Without thinking no effort line is written, and a V4.1 request without system text has
  // no system turn.
  request.variables = Json::object();
  request.messages.erase(0);
  EXPECT_EQ(render(DeepSeekEncoding::kV41, request).text,
            kBos + "<｜User｜>Hi<｜Assistant｜></think>");
}

ChatRequest tool_conversation() {
  Json calls = Json::array(
      {{{"id", "a"},
        {"type", "function"},
        {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\",\"days\":3}"}}}},
       {{"id", "b"},
        {"type", "function"},
        {"function", {{"name", "get_time"}, {"arguments", {{"tz", "CET"}}}}}}});
  ChatRequest request =
      conversation(Json::array({{{"role", "system"}, {"content", "S"}},
                                {{"role", "user"}, {"content", "Weather?"}},
                                {{"role", "assistant"}, {"content", ""}, {"tool_calls", calls}},
                                {{"role", "tool"}, {"tool_call_id", "b"}, {"content", "12:00"}},
                                {{"role", "tool"}, {"tool_call_id", "a"}, {"content", "sunny"}}}));
  request.tools = Json::array({{{"type", "function"},
                                {"function",
                                 {{"name", "get_weather"},
                                  {"description", "Weather by city"},
                                  {"parameters", {{"type", "object"}}}}}}});
  return request;
}

TEST(DeepSeekEncoding, ToolsSectionCallsInHistoryAndOrderedResults) {
  ChatRequest request = tool_conversation();
  std::string text = render(DeepSeekEncoding::kV4, request).text;
  EXPECT_THAT(text, StartsWith(kBos + "S\n\n## Tools\n\n"));
  EXPECT_THAT(text, HasSubstr("\n{\"name\":\"get_weather\",\"description\":\"Weather by city\","
                              "\"parameters\":{\"type\":\"object\"}}<｜User｜>"));
  const std::string history =
      "<｜User｜>Weather?<｜Assistant｜></think><｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"get_time\">\n"
      "<｜DSML｜parameter name=\"tz\" string=\"true\">CET</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
      "<｜User｜><tool_result>sunny</tool_result>\n\n<tool_result>12:00</tool_result>"
      "<｜Assistant｜></think>";
  EXPECT_THAT(text, testing::EndsWith(history));
  // V4.1 spells the tags with a space after ｜DSML｜ and opens the system turn with a token.
  std::string v41 = render(DeepSeekEncoding::kV41, request).text;
  EXPECT_THAT(v41, StartsWith(kBos + "<｜System｜>S\n\n## Tools"));
  EXPECT_THAT(v41, HasSubstr("<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
                             "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ "
                             "parameter>"));
  EXPECT_THAT(v41, HasSubstr("</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>"));
  // tool_choice none: no tools section.
  request.tool_choice.mode = ToolChoice::Mode::kNone;
  EXPECT_THAT(render(DeepSeekEncoding::kV4, request).text, StartsWith(kBos + "S<｜User｜>"));
}

TEST(DeepSeekEncoding, ReasoningHistoryMidSystemAndResponseFormat) {
  ChatRequest request = conversation(
      Json::array({{{"role", "user"}, {"content", "Q1"}},
                   {{"role", "assistant"}, {"content", "A1"}, {"reasoning_content", "R1"}},
                   {{"role", "system"}, {"content", "Now be formal."}},
                   {{"role", "user"}, {"content", "Q2"}},
                   {{"role", "assistant"}, {"content", "A2"}, {"reasoning_content", "R2"}}}));
  request.variables["thinking"] = true;
  request.variables["reasoning_effort"] = "high";
  request.add_generation_prompt = false;
  // Reasoning before the last user turn is dropped (no tools); the latest is kept.
  EXPECT_EQ(render(DeepSeekEncoding::kV4, request).text,
            kBos + "<｜User｜>Q1<｜Assistant｜></think>A1<｜end▁of▁sentence｜>" +
                "<｜User｜>Now be formal.\n\nQ2<｜Assistant｜><think>R2</think>A2" +
                "<｜end▁of▁sentence｜>");
  DeepSeekPromptOptions keep;
  keep.version = DeepSeekEncoding::kV41;
  keep.keep_all_reasoning = true;
  EXPECT_THAT(render_deepseek_prompt(keep, request).text,
              HasSubstr("<｜Assistant｜><think>R1</think>A1<｜end▁of▁sentence｜><｜System｜>Now be "
                        "formal.<｜User｜>Q2"));
  request.variables = Json::object();
  request.json_output = true;
  EXPECT_THAT(render(DeepSeekEncoding::kV41, request).text,
              StartsWith(kBos + "<｜System｜>## Response Format\n\n"));
}

TEST(DeepSeekEncoding, ForcedCallsSkipThinking) {
  ChatRequest request = tool_conversation();
  request.variables["thinking"] = true;
  request.tool_choice.mode = ToolChoice::Mode::kRequired;
  EXPECT_THAT(render(DeepSeekEncoding::kV41, request).text,
              testing::EndsWith("<｜Assistant｜></think>"));
  ForcedCallText v41 = dsml_forced_call(DeepSeekEncoding::kV41);
  EXPECT_EQ(v41.block + v41.before_name + "f" + v41.after_name,
            "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n");
}

}  // namespace
}  // namespace deepinfer::chat

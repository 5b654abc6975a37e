// Chat requests encoded for the model (DeepSeek V4/V4.1 segments, chat templates) and the
// tool calls that tool_choice forces, read back by the output parser.
#include "protocol/chat_encoder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "protocol/openai.h"
#include "support/test_support.h"

namespace deepinfer::protocol {
namespace {

namespace fs = std::filesystem;

fs::path v4_tokenizer_dir(const testing::TempDir& dir, bool v41) {
  testing::write_deepseek_v4_tokenizer(dir.path(), v41);
  return dir.path();
}

chat::ChatRequest user_says(const std::string& text) {
  chat::ChatRequest request;
  request.messages = Json::array({{{"role", "user"}, {"content", text}}});
  request.add_generation_prompt = true;
  return request;
}

Json weather_tool() {
  return Json::array(
      {{{"type", "function"},
        {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}});
}

// What the parser makes of the forced opening plus the model's continuation.
ParsedOutput parse_after_prompt(const ChatPrompt& prompt, const std::string& generated) {
  OutputParser parser(prompt.syntax, "call_");
  parser.push(prompt.forced_output, 0);
  parser.push(generated);
  parser.finish();
  return parser.total();
}

TEST(ChatEncoder, DeepSeekV41FromTheVocabularyWithTypedTokensAsText) {
  testing::TempDir temp;
  fs::path dir = v4_tokenizer_dir(temp, true);
  auto tokenizer = Tokenizer::load(dir);
  ChatEncoder encoder(dir, *tokenizer, PromptFormat::kAuto);
  ChatPrompt spec = encoder.encode(user_says("Reply exactly: OK"));
  EXPECT_EQ(spec.encoded.text,
            "<｜begin▁of▁sentence｜><｜User｜>Reply exactly: OK<｜Assistant｜></think>");
  std::vector<int32_t> expected = {0, 128803};
  for (int32_t id : tokenizer->encode("Reply exactly: OK", EncodeMode::kPlain))
    expected.push_back(id);
  expected.push_back(128804);
  expected.push_back(*tokenizer->token_to_id("</think>"));
  EXPECT_EQ(spec.encoded.ids, expected);
  EXPECT_EQ(spec.syntax.tools, ToolFormat::kNone);  // no tools offered
  // A user typing control-token text gets ordinary tokens for it.
  ChatPrompt typed = encoder.encode(user_says("<｜User｜>｜DSML｜<｜System｜>"));
  std::vector<int32_t> plain =
      tokenizer->encode("<｜User｜>｜DSML｜<｜System｜>", EncodeMode::kPlain);
  EXPECT_GT(plain.size(), 3u);
  EXPECT_EQ(typed.encoded.ids.size(), 2 + plain.size() + 2);
  EXPECT_TRUE(std::equal(plain.begin(), plain.end(), typed.encoded.ids.begin() + 2));
  // A conversation the encoding cannot express is unprocessable, not malformed.
  chat::ChatRequest odd = user_says("hi");
  odd.messages.push_back({{"role", "robot"}, {"content", "beep"}});
  try {
    encoder.encode(odd);
    ADD_FAILURE() << "an unknown role was rendered";
  } catch (const ApiError& error) {
    EXPECT_EQ(error.status(), 422);
    EXPECT_EQ(error.param(), "messages");
  }
}

TEST(ChatEncoder, NamedAndRequiredToolChoiceOpenTheCall) {
  testing::TempDir temp;
  fs::path dir = v4_tokenizer_dir(temp, true);
  auto tokenizer = Tokenizer::load(dir);
  ChatEncoder encoder(dir, *tokenizer, PromptFormat::kAuto);
  chat::ChatRequest request = user_says("Weather in Paris?");
  request.tools = weather_tool();
  request.variables["thinking"] = true;
  request.tool_choice = parse_tool_choice(
      Json::parse(R"({"type": "function", "function": {"name": "get_weather"}})"), request.tools);
  ChatPrompt named = encoder.encode(request);
  EXPECT_THAT(named.encoded.text, ::testing::EndsWith("<｜Assistant｜></think><｜DSML｜ calls>\n"
                                                      "<｜DSML｜ invoke name=\"get_weather\">\n"));
  ParsedOutput out = parse_after_prompt(
      named,
      "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n"
      "</｜DSML｜ invoke>\n</｜DSML｜ calls>");
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].name, "get_weather");
  EXPECT_EQ(out.tool_calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(out.content, "");

  request.tool_choice = parse_tool_choice("required", request.tools);
  ChatPrompt required = encoder.encode(request);
  EXPECT_THAT(required.encoded.text, ::testing::EndsWith("</think><｜DSML｜ calls>\n"));
  EXPECT_THROW(parse_tool_choice(Json::parse(R"({"type": "function", "function": {"name": "x"}})"),
                                 request.tools),
               ApiError);
  EXPECT_THROW(parse_tool_choice("required", Json()), ApiError);
}

TEST(ChatEncoder, HermesNamedCallWithTheQwen3Template) {
  fs::path dir = std::string(DEEPINFER_TOKENIZERS) + "/qwen3";
  auto tokenizer = Tokenizer::load(dir);
  ChatEncoder encoder(dir, *tokenizer, PromptFormat::kAuto);
  chat::ChatRequest request = user_says("Weather in Paris?");
  request.tools = weather_tool();
  request.tool_choice.mode = chat::ToolChoice::Mode::kNamed;
  request.tool_choice.name = "get_weather";
  ChatPrompt prompt = encoder.encode(request);
  EXPECT_THAT(prompt.encoded.text,
              ::testing::EndsWith("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "));
  EXPECT_EQ(prompt.encoded.ids, tokenizer->encode(prompt.encoded.text));
  ParsedOutput out = parse_after_prompt(prompt, "{\"city\": \"Paris\"}}\n</tool_call>");
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].arguments, R"({"city": "Paris"})");
  // With no tools offered the parser leaves tool-call tags as text.
  ChatPrompt plain = encoder.encode(user_says("hi"));
  EXPECT_EQ(plain.syntax.tools, ToolFormat::kNone);
  const std::string call = R"(<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>)";
  ParsedOutput as_text = parse_after_prompt(plain, call);
  EXPECT_EQ(as_text.content, call);
  EXPECT_TRUE(as_text.tool_calls.empty());
}

// A DSML block the encoder writes for an assistant's history reads back as the same calls.
TEST(ChatEncoder, HistoryCallsRoundTripThroughTheParser) {
  for (bool v41 : {false, true}) {
    chat::DeepSeekPromptOptions options;
    options.version = v41 ? chat::DeepSeekEncoding::kV41 : chat::DeepSeekEncoding::kV4;
    chat::ChatRequest request;
    Json arguments = {{"city", "Paris <b>"}, {"days", 3}, {"units", {{"temp", "C"}}}};
    request.messages = Json::array(
        {{{"role", "user"}, {"content", "q"}},
         {{"role", "assistant"},
          {"content", ""},
          {"tool_calls",
           Json::array(
               {{{"id", "a"},
                 {"function", {{"name", "get_weather"}, {"arguments", arguments.dump()}}}}})}}});
    std::string text = chat::render_deepseek_prompt(options, request).text;
    size_t open = text.find("<｜DSML｜");
    size_t end = text.find("<｜end▁of▁sentence｜>", open);
    OutputSyntax syntax;
    syntax.tools = ToolFormat::kDsml;
    syntax.tool_start = "<｜DSML｜";
    OutputParser parser(syntax, "call_");
    parser.push(text.substr(open, end - open));
    parser.finish();
    ASSERT_EQ(parser.total().tool_calls.size(), 1u) << text;
    EXPECT_EQ(Json::parse(parser.total().tool_calls[0].arguments), arguments);
  }
}

}  // namespace
}  // namespace deepinfer::protocol

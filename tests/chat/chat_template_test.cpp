// Chat templates of real model families against transformers' renders (golden.json), and the
// template language's own rules and limits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "chat/model_template.h"
#include "chat/template.h"
#include "core/error.h"

namespace deepinfer::chat {
namespace {

using json = nlohmann::ordered_json;

json read_fixture(const std::string& name) {
  std::ifstream stream(std::string(DEEPINFER_FIXTURES) + "/tokenizers/" + name);
  return json::parse(stream);
}

ChatRequest request_for(const json& conversation, bool add_generation_prompt) {
  ChatRequest request;
  request.add_generation_prompt = add_generation_prompt;
  if (conversation.is_array()) {
    request.messages = conversation;
    return request;
  }
  for (const auto& [key, value] : conversation.items()) {
    if (key == "messages") {
      request.messages = value;
    } else if (key == "tools") {
      request.tools = value;
    } else {
      request.variables[key] = value;
    }
  }
  return request;
}

class GoldenChat : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenChat, RendersEveryConversationLikeTransformers) {
  ModelChatTemplate chat =
      ModelChatTemplate::load(std::string(DEEPINFER_TOKENIZERS) + "/" + GetParam());
  json conversations = read_fixture("conversations.json");
  json golden = read_fixture("golden.json").at(GetParam()).at("chat");
  ASSERT_FALSE(golden.empty());
  for (const json& expected : golden) {
    int index = expected.at("conversation").get<int>();
    bool generation = expected.at("add_generation_prompt").get<bool>();
    ChatRequest request = request_for(conversations.at(static_cast<size_t>(index)), generation);
    std::string label = "conversation " + std::to_string(index) + (generation ? " +gen" : "");
    if (expected.contains("error")) {
      try {
        chat.render(request);
        ADD_FAILURE() << label << ": rendered, but transformers raised " << expected["error"];
      } catch (const Error& error) {
        std::string want = expected["error"].get<std::string>();
        want = want.substr(want.find(": ") + 2);  // "TemplateError: <message>"
        EXPECT_NE(std::string(error.what()).find(want), std::string::npos) << error.what();
      }
      continue;
    }
    EXPECT_EQ(chat.render(request), expected.at("text").get<std::string>()) << label;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GoldenChat,
                         ::testing::Values("deepseek_v3", "qwen3", "llama3", "gemma3"));

std::string render(const std::string& source, const json& context = json::object(),
                   const RenderLimits& limits = {}) {
  return ChatTemplate(source).render(context, limits);
}

std::string render_error(const std::string& source, const json& context = json::object(),
                         const RenderLimits& limits = {}) {
  try {
    render(source, context, limits);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(ChatTemplate, StatementsAndExpressions) {
  EXPECT_EQ(
      render(
          "{% for x in xs %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}",
          {{"xs", {"a", "b"}}}),
      "1a,2b");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}"
                   "{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                   "{{ greet('Ann') }} {{ greet('Bo', punct='?') }}"),
            "Hi Ann! Hi Bo?");
  EXPECT_EQ(render("{% filter upper %}abc{% endfilter %}{{ 'a,b'.split(',')[::-1] | join('-') }}"),
            "ABCb-a");
  EXPECT_EQ(render("{{ {'b': 1, 'a': [1, 2.5, none, true]} | tojson }}"),
            "{\"b\": 1, \"a\": [1, 2.5, null, true]}");
  EXPECT_EQ(render("{{ x | tojson(indent=2) }}", {{"x", {{"k", {1}}}}}),
            "{\n  \"k\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{{ 'é' | tojson }}"), "\"é\"");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 1 / 2 }} {{ 'a' ~ 1 }}"),
            "3 -4 1 0.5 a1");
  EXPECT_EQ(render("{{ x is defined }} {{ y is none }} {{ 'a' in 'cat' }} {{ 2 if false else 3 }}",
                   {{"y", nullptr}}),
            "False True True 3");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"a", 1}}}}),
            "a=1;");
  EXPECT_EQ(
      render("{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ 'Hello'.startswith('He') }}"),
      "x|hi|True");
  EXPECT_EQ(render("{% for m in ms | selectattr('role', 'equalto', 'user') %}{{ m.c }}{% endfor %}",
                   {{"ms", {{{"role", "user"}, {"c", "1"}}, {{"role", "bot"}, {"c", "2"}}}}}),
            "1");
}

TEST(ChatTemplate, CallBlocksAndLoopCycle) {
  EXPECT_EQ(render("{% macro box(title) %}[{{ title }}: {{ caller() }}]{% endmacro %}"
                   "{% call box('t') %}inner{% endcall %}"),
            "[t: inner]");
  EXPECT_EQ(render("{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}"
                   "{% call(item) each([1, 2]) %}<{{ item }}>{% endcall %}"),
            "<1><2>");
  EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.cycle('+', '-') }}{{ x }}{% endfor %}"), "+a-b+c");
  EXPECT_EQ(render("a{% generation %}b{% endgeneration %}c"), "abc");
}

TEST(ChatTemplate, WhitespaceControlMatchesTransformers) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(render("{% if true %}\n    yes\n    {% endif %}\nend"), "    yes\nend");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("{{ 'x' }}\n{{ 'y' }}"), "x\ny");
}

TEST(ChatTemplate, ErrorsAreClearAndBounded) {
  EXPECT_NE(render_error("{{ raise_exception('bad roles') }}").find("bad roles"),
            std::string::npos);
  EXPECT_NE(render_error("{% if x %}").find("endif"), std::string::npos);
  EXPECT_NE(render_error("{{ 1 + }}").find("line 1"), std::string::npos);
  EXPECT_NE(render_error("{{ x | nosuchfilter }}").find("no filter named 'nosuchfilter'"),
            std::string::npos);
  EXPECT_NE(render_error("{{ 'a' + 1 }}").find("unsupported operand"), std::string::npos);
  // Hostile templates stop at the limits instead of hanging or exhausting memory.
  RenderLimits small;
  small.max_steps = 10000;
  EXPECT_NE(render_error("{% for i in range(1000000) %}{{ i }}{% endfor %}", json::object(), small)
                .find("exceeded 10000 steps"),
            std::string::npos);
  small.max_output_bytes = 1000;
  small.max_steps = 5'000'000;
  EXPECT_NE(
      render_error("{% for i in range(100000) %}xxxxxxxxxx{% endfor %}", json::object(), small)
          .find("output exceeds"),
      std::string::npos);
  EXPECT_NE(
      render_error("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}").find("nested deeper"),
      std::string::npos);
  // Nesting deep enough to overflow a recursive parser's stack (found by fuzzing: 20,000
  // parentheses) is an Error; so are chains too long to render within the stack.
  auto repeat = [](const std::string& text, int times) {
    std::string out;
    for (int i = 0; i < times; ++i) out += text;
    return out;
  };
  for (const std::string& source :
       {"{{ " + repeat("(", 20000) + "1" + repeat(")", 20000) + " }}",
        "{{ " + repeat("not ", 20000) + "x }}", "{{ " + repeat("-", 20000) + "1 }}",
        "{{ [" + repeat("[", 100) + repeat("]", 100) + "] }}",
        repeat("{% if x %}", 5000) + repeat("{% endif %}", 5000),
        "{{ 1" + repeat(" + 1", 3000) + " }}", "{{ x" + repeat("|trim", 1000) + " }}"}) {
    std::string error = render_error(source);
    EXPECT_TRUE(error.find("levels deep") != std::string::npos ||
                error.find("tokens") != std::string::npos)
        << source.substr(0, 60) << ": " << error;
  }
  EXPECT_EQ(ChatTemplate("{{ 1" + repeat(" + 1", 200) + " }}").render(json::object()), "201");
  // The bracket bound is what it says: 60 nested parentheses are fine, 70 are not.
  EXPECT_EQ(
      ChatTemplate("{{ " + repeat("(", 60) + "1" + repeat(")", 60) + " }}").render(json::object()),
      "1");
  EXPECT_NE(render_error("{{ " + repeat("(", 70) + "1" + repeat(")", 70) + " }}")
                .find("nested more than 64 levels"),
            std::string::npos);
}

// Numbers a template cannot hold (found by fuzzing: std::stoll threw out_of_range) are an
// Error; the float filter falls back to its default like Jinja's.
TEST(ChatTemplate, NumbersOutOfRangeAreErrorsOrDefaults) {
  EXPECT_THROW(ChatTemplate("{{ 99999999999999999999999 }}"), Error);
  EXPECT_EQ(ChatTemplate("{{ 9223372036854775807 }}").render(nlohmann::ordered_json::object()),
            "9223372036854775807");
  EXPECT_EQ(ChatTemplate("{{ 'x' | float }}|{{ '1.5x' | float(default=2.5) }}|{{ ' 2 ' | float }}")
                .render(nlohmann::ordered_json::object()),
            "0.0|2.5|2.0");
}

TEST(ModelChatTemplate, FolderFilesAndSpecialTokensFromModelConfig) {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("deepinfer-chat-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json")
      << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
             "added_tokens": [{"id": 7, "content": "<s>", "special": true}]})";
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"chat_template": [{"name": "default", "template": "D{{ bos_token }}"},
                               {"name": "tool_use", "template": "T{{ bos_token }}"}]})";
  std::ofstream(dir / "config.json") << R"({"bos_token_id": 7})";
  ChatRequest request;
  EXPECT_EQ(ModelChatTemplate::load(dir).render(request), "D<s>");
  EXPECT_EQ(ModelChatTemplate::load(dir, "tool_use").render(request), "T<s>");
  std::ofstream(dir / "chat_template.jinja") << "J{{ messages | length }}";
  EXPECT_EQ(ModelChatTemplate::load(dir).render(request), "J0");
  std::filesystem::remove_all(dir);
  EXPECT_THROW(ModelChatTemplate::load(dir), Error);
}

// A model folder whose config names a bos id but which has no tokenizer.json, or one of an
// unexpected shape, once threw a JSON type error from the loader; the token is simply unnamed.
TEST(ModelChatTemplate, SpecialTokenIdsWithoutAUsableTokenizerAreUnnamed) {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("deepinfer-chat-ids-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "[{{ bos_token }}]"})";
  std::ofstream(dir / "config.json") << R"({"bos_token_id": 7})";
  ChatRequest request;
  EXPECT_EQ(ModelChatTemplate::load(dir).render(request), "[]");
  for (const char* tokenizer : {R"([1, 2])", R"({"added_tokens": [3, {"id": "7"}], "model": 1})",
                                R"({"added_tokens": {"id": 7}})"}) {
    std::ofstream(dir / "tokenizer.json") << tokenizer;
    EXPECT_EQ(ModelChatTemplate::load(dir).render(request), "[]") << tokenizer;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace deepinfer::chat

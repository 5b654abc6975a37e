// Grammar constraints: GBNF and Lark grammars' languages against independent recognisers
// (nlohmann's JSON parser, counters for balanced brackets) on many strings, recursion of every
// kind, refused constructs named with their line, and the token mask against trying every
// token one by one.
#include "structured/grammar.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "structured/structured.h"

namespace deepinfer::structured {
namespace {

std::unique_ptr<Matcher> start(const std::string& grammar) {
  return grammar_constraint(TokenTable::single_bytes(), grammar)->start();
}

// The whole text is a sentence: every byte accepted, then complete.
bool sentence(Matcher& matcher, const std::string& text) {
  std::unique_ptr<Matcher> m = matcher.clone();
  for (char c : text)
    if (!m->accept(static_cast<uint8_t>(c))) return false;
  return m->complete();
}

bool sentence(const std::string& grammar, const std::string& text) {
  return sentence(*start(grammar), text);
}

// A JSON grammar in GBNF, written the way llama.cpp's examples write it (long rules wrapped).
const char* const kJsonGbnf = R"(
root   ::= value
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::=
  "{" ws (
    string ws ":" ws value ws
    ("," ws string ws ":" ws value ws)*
  )? "}"
array  ::= "[" ws ( value ws ("," ws value ws)* )? "]"
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\""
number ::= "-"? ([0-9] | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
ws     ::= [ \t\n]*   # short runs of white space
)";

const char* const kJsonLark = R"(
start: value
?value: object | array | string | SIGNED_NUMBER -> number
      | "true" -> true | "false" -> false | "null" -> null
array  : "[" [value ("," value)*] "]"
object : "{" [pair ("," pair)*] "}"
pair   : string ":" value
string : ESCAPED_STRING
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
)";

std::vector<std::string> json_samples() {
  return {"{}",
          "[]",
          "{\"a\": [1, 2.5, -3e4, true, null], \"b\": {\"c\": \"x\\u00e9\\n\"}}",
          "[[[[[]]]], {}, \"\"]",
          "-0.5",
          "\"unterminated",
          "{\"a\" 1}",
          "[1, 2,]",
          "01",
          "{\"a\": tru}",
          "[1 2]",
          "\"bad \\q escape\"",
          "{\"k\":\n\t[ ]}",
          "nul",
          "[\"\\u12\"]",
          "{\"a\":1}}",
          ""};
}

TEST(Grammar, GbnfJsonAgreesWithAJsonParser) {
  const auto matcher = start(kJsonGbnf);
  for (const std::string& text : json_samples()) {
    SCOPED_TRACE(text);
    EXPECT_EQ(sentence(*matcher, text), nlohmann::json::accept(text));
  }
}

TEST(Grammar, LarkJsonAgreesWithAJsonParser) {
  const auto matcher = start(kJsonLark);
  for (const std::string& text : json_samples()) {
    SCOPED_TRACE(text);
    // Lark's SIGNED_NUMBER takes "01" and its ESCAPED_STRING any escaped character.
    if (text == "01" || text.find('\\') != std::string::npos) continue;
    EXPECT_EQ(sentence(*matcher, text), nlohmann::json::accept(text));
  }
  EXPECT_TRUE(sentence(*matcher, " { \"a\" : [ 1 , 2 ] } \n"));
}

// Random strings over a small alphabet against a counter, for every shape of recursion.
TEST(Grammar, RecursionOfEveryShapeMatchesACounter) {
  const std::vector<std::string> grammars = {
      R"g(root ::= "(" root ")" root | "")g",  // right and nested
      R"g(root ::= root "(" root ")" | "")g",  // left
      R"g(root ::= ("(" root ")")*)g",         // through a repeat
      R"g(root ::= x
         x ::= "" | "(" y ")" x
         y ::= x)g",                           // mutual
  };
  std::mt19937 rng(3);
  for (const std::string& grammar : grammars) {
    SCOPED_TRACE(grammar);
    const auto matcher = start(grammar);
    for (int n = 0; n < 300; ++n) {
      std::string text;
      const int length = static_cast<int>(rng() % 12);
      for (int i = 0; i < length; ++i) text.push_back(rng() % 2 ? '(' : ')');
      int depth = 0;
      bool balanced = true;
      for (char c : text) {
        depth += c == '(' ? 1 : -1;
        balanced = balanced && depth >= 0;
      }
      balanced = balanced && depth == 0;
      EXPECT_EQ(sentence(*matcher, text), balanced) << text;
    }
  }
}

TEST(Grammar, RepeatsOfStructureKeepTheirBounds) {
  const std::string grammar = R"(root ::= item{2,3} "."
item ::= "<" root? ">")";
  EXPECT_TRUE(sentence(grammar, "<><>."));
  EXPECT_TRUE(sentence(grammar, "<><><>."));
  EXPECT_FALSE(sentence(grammar, "<>."));
  EXPECT_FALSE(sentence(grammar, "<><><><>."));
  EXPECT_TRUE(sentence(grammar, "<<><>.><>."));
  EXPECT_TRUE(sentence(R"(root ::= [a-c]{3} "-" [0-9]{1,}  "|" "x"?)", "abc-12|"));
  EXPECT_FALSE(sentence(R"(root ::= [a-c]{3} "-" [0-9]{1,}  "|" "x"?)", "ab-12|x"));
}

TEST(Grammar, AmbiguityAndEmptyLanguagesParse) {
  // The second alternative never ends: only the first is left.
  const auto matcher = start(R"(root ::= "a" | "b" x
x ::= "c" x)");
  EXPECT_TRUE(sentence(*matcher, "a"));
  EXPECT_FALSE(matcher->clone()->accept('b'));
  EXPECT_TRUE(sentence(R"(root ::= x x x
x ::= "a"* | "ab")",
                       "aaba"));
  EXPECT_TRUE(sentence(R"(root ::= "")", ""));
  EXPECT_FALSE(sentence(R"(root ::= "")", "a"));
  EXPECT_TRUE(sentence(R"(root ::= "é" [α-ω]+ .)", "éαβ\n"));
}

TEST(Grammar, LarkSyntax) {
  const std::string grammar = R"(
// a command language
start: command (";" command)*
command: VERB _NAME ~ 1..2 | "stop"i
VERB: "go" | "look"
_NAME: /[a-z]+/
%ignore " "
)";
  EXPECT_TRUE(sentence(grammar, "go north; look a b;STOP"));
  EXPECT_TRUE(sentence(grammar, "  go  x ;sToP "));
  EXPECT_FALSE(sentence(grammar, "go a b c"));
  EXPECT_FALSE(sentence(grammar, "run x"));
  EXPECT_TRUE(sentence("start: (\"a\"..\"c\")+ [\"!\"]", "abca!"));
  EXPECT_FALSE(sentence("start: (\"a\"..\"c\")+ [\"!\"]", "abd"));
}

TEST(Grammar, RefusalsNameTheConstructAndLine) {
  auto refusal = [](const std::string& grammar) {
    try {
      grammar_constraint(TokenTable::single_bytes(), grammar);
    } catch (const GrammarError& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal("root ::= a").find("'a' is used but never defined"), std::string::npos);
  EXPECT_NE(refusal("root ::= \"x\"\nroot ::= \"y\"").find("defined twice"), std::string::npos);
  EXPECT_NE(refusal("root ::= \"x\"\n  \"y\" (").find("line 2"), std::string::npos);
  EXPECT_NE(refusal("root ::= \"\\q\"").find("unknown escape"), std::string::npos);
  EXPECT_NE(refusal("root ::= x\nx ::= \"a\" x").find("'root' derives no text"), std::string::npos);
  EXPECT_NE(refusal("root ::= <think>").find("token references"), std::string::npos);
  EXPECT_NE(refusal("root ::= \"a\"{5,2}").find("upper bound"), std::string::npos);
  EXPECT_NE(refusal("start: x{a}").find("templates"), std::string::npos);
  EXPECT_NE(refusal("start: /a/i").find("flag 'i'"), std::string::npos);
  EXPECT_NE(refusal("start: /(?=a)/").find("lark grammar, line 1"), std::string::npos);
  EXPECT_NE(refusal("%import other.X\nstart: X").find("only Lark's common library"),
            std::string::npos);
  EXPECT_NE(refusal("rule: \"x\"").find("'start' is used but never defined"), std::string::npos);
  EXPECT_NE(refusal(std::string(GrammarSource::kMaxGrammarBytes + 1, ' ')).find("more than"),
            std::string::npos);
}

// The mask of each state met along sentences is exactly the tokens a matcher accepts one by one.
TEST(Grammar, MasksAreTheTokensAcceptedOneByOne) {
  std::vector<std::string> vocabulary = {
      "{",   "}",   "\"",   "\":",  "\": ", "[",   "]",  ",",    ", ", " ",    "\n",    "a",
      "ab",  "abc", "1",    "12",   "-",    ".5",  "e3", "true", "tr", "null", "\"a\"", "\\",
      "\\n", "é",   "\xC3", "\xA9", "{\"",  "\"}", "}]", "]}",   "0",  "x\"",  "ue"};
  const int32_t end = static_cast<int32_t>(vocabulary.size());
  vocabulary.emplace_back("<end>");
  const auto table =
      std::make_shared<TokenTable>(vocabulary, std::vector<int32_t>{end}, std::vector<int32_t>{});
  for (const char* grammar : {kJsonGbnf, kJsonLark}) {
    const auto constraint = grammar_constraint(table, grammar);
    std::mt19937 rng(11);
    for (int run = 0; run < 20; ++run) {
      auto matcher = constraint->start();
      for (int step = 0; step < 30; ++step) {
        std::vector<float> logits(vocabulary.size(), 0.0f);
        matcher->mask_logits(logits.data(), static_cast<int32_t>(logits.size()));
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < static_cast<int32_t>(vocabulary.size()); ++id) {
          const bool accepted = matcher->clone()->accept(id);
          EXPECT_EQ(accepted, logits[static_cast<size_t>(id)] == 0.0f)
              << "token '" << vocabulary[static_cast<size_t>(id)] << "' at step " << step;
          if (accepted) allowed.push_back(id);
        }
        if (allowed.empty()) break;
        const int32_t token = allowed[rng() % allowed.size()];
        if (token == end) break;
        ASSERT_TRUE(matcher->accept(token));
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::structured

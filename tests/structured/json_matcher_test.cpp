// The json_object constraint: which tokens its mask allows, what it accepts, and that what
// masked sampling produces over a real vocabulary always parses.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "structured/structured.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::structured {
namespace {

// A small vocabulary: the end token is id 0, a control token id 1.
const std::vector<std::string> kTokens = {
    "",   "<ctl>", "{",   "}",  "[",   "]",    "\"",      "a",        "\":",  " ",    ",",
    "1",  "-",     "0",   ".5", "e+3", "true", "tr",      "ue",       "nul",  "\\",   "u00e9",
    "\n", "{\"",   "\"}", "}}", "x",   ":",    "<think>", "</think>", "\xc3", "\xa9", "\xc3\xa9"};

std::shared_ptr<const TokenTable> small_table() {
  return std::make_shared<TokenTable>(kTokens, std::vector<int32_t>{0}, std::vector<int32_t>{1});
}

int32_t id_of(const std::string& text) {
  return static_cast<int32_t>(std::find(kTokens.begin(), kTokens.end(), text) - kTokens.begin());
}

std::vector<std::string> allowed(const Matcher& matcher) {
  std::vector<float> logits(kTokens.size(), 0.0f);
  matcher.mask_logits(logits.data(), static_cast<int32_t>(logits.size()));
  std::vector<std::string> out;
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isinf(logits[i])) out.push_back(i == 0 ? "<end>" : kTokens[i]);
  return out;
}

bool feed(Matcher& matcher, const std::vector<std::string>& tokens) {
  for (const std::string& token : tokens)
    if (!matcher.accept(id_of(token))) return false;
  return true;
}

TEST(JsonObjectConstraint, MaskFollowsTheGrammar) {
  auto matcher = json_object_constraint(small_table())->start();
  EXPECT_EQ(allowed(*matcher), (std::vector<std::string>{"{", " ", "\n", "{\""}));
  ASSERT_TRUE(feed(*matcher, {"{\"", "a", "\":"}));
  // A value: no close, no comma, no colon; "tr" may start true, "nul" null, and tokens
  // that open a string may carry its first characters.
  EXPECT_EQ(allowed(*matcher), (std::vector<std::string>{"{", "[", "\"", "\":", " ", "1", "-", "0",
                                                         "true", "tr", "nul", "\n", "{\"", "\"}"}));
  ASSERT_TRUE(feed(*matcher, {"-", "0", ".5", "e+3", ",", "\"", "\\", "u00e9", "\"", ":", "[", "tr",
                              "ue", "]"}));
  EXPECT_FALSE(matcher->complete());
  EXPECT_FALSE(matcher->accept(id_of("]")));  // the object is open, not an array
  EXPECT_FALSE(matcher->accept(0));           // no end before the object closes
  ASSERT_TRUE(feed(*matcher, {"}"}));
  EXPECT_TRUE(matcher->complete());
  EXPECT_EQ(allowed(*matcher), (std::vector<std::string>{"<end>"}));
  EXPECT_TRUE(matcher->accept(0));
}

TEST(JsonObjectConstraint, RejectsWhatJsonForbids) {
  auto constraint = json_object_constraint(small_table());
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"["},
                                              {"{", "a"},
                                              {"{", "}", "}"},
                                              {"{\"", "a", "\":", "0", "1"},
                                              {"{\"", "a", "\":", "-", "]"},
                                              {"{\"", "a", "\":", "nul", "x"},
                                              {"{\"", "\\", "x"},
                                              {"<ctl>"},
                                              {"{", ","},
                                              {"{\"", "a", "\"}"}}) {
    auto matcher = constraint->start();
    EXPECT_FALSE(feed(*matcher, bad)) << testing::PrintToString(bad);
  }
  // Whitespace runs are capped.
  auto matcher = constraint->start();
  int spaces = 0;
  while (matcher->accept(id_of(" ")) && spaces < 1000) ++spaces;
  EXPECT_LT(spaces, 100);
  EXPECT_TRUE(matcher->accept(id_of("{")));
}

// JSON text is UTF-8: a string takes a character whole or cut over tokens, never a fragment
// alone or a character cut off by the closing quote.
TEST(JsonObjectConstraint, StringsHoldWellFormedUtf8) {
  auto constraint = json_object_constraint(small_table());
  auto matcher = constraint->start();
  ASSERT_TRUE(feed(*matcher, {"{\"", "\xc3\xa9", "\xc3", "\xa9", "\":", "\"", "\xc3"}));
  EXPECT_EQ(allowed(*matcher), (std::vector<std::string>{"\xa9"}));
  ASSERT_TRUE(feed(*matcher, {"\xa9", "\"}"}));
  EXPECT_TRUE(matcher->complete());
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"{\"", "\xa9"}, {"{\"", "\xc3", "\"}"}, {"{\"", "\xc3", "\xc3"}}) {
    auto probe = constraint->start();
    EXPECT_FALSE(feed(*probe, bad)) << testing::PrintToString(bad);
  }
}

// A reasoning model may think first; the JSON starts after </think>, or at once when the
// first token is not <think>.
TEST(JsonObjectConstraint, AfterReasoning) {
  auto json = json_object_constraint(small_table());
  auto constraint = after_reasoning(json, id_of("<think>"), id_of("</think>"), false);
  auto matcher = constraint->start();
  EXPECT_EQ(allowed(*matcher), (std::vector<std::string>{"{", " ", "\n", "{\"", "<think>"}));
  ASSERT_TRUE(feed(*matcher, {"<think>", "x", "}", "a"}));  // free inside the reasoning
  EXPECT_EQ(allowed(*matcher).size(), kTokens.size());
  EXPECT_FALSE(matcher->complete());
  ASSERT_TRUE(feed(*matcher, {"</think>", "\n"}));
  EXPECT_FALSE(matcher->accept(id_of("x")));
  EXPECT_FALSE(matcher->accept(id_of("<think>")));
  ASSERT_TRUE(feed(*matcher, {"{", "}"}));
  EXPECT_TRUE(matcher->complete());

  auto direct = constraint->start();
  ASSERT_TRUE(feed(*direct, {"{"}));
  EXPECT_FALSE(direct->accept(id_of("<think>")));  // too late to reason
  auto opened = after_reasoning(json, id_of("<think>"), id_of("</think>"), true)->start();
  ASSERT_TRUE(feed(*opened, {"x", "</think>", "{", "}"}));
  EXPECT_TRUE(opened->complete());
}

// Masked sampling over Qwen3's 151k-token vocabulary, with random logits nudged towards
// closing tokens so that walks finish: every finished output is one JSON object.
TEST(JsonObjectConstraint, RandomWalksOverARealVocabularyParse) {
  auto tokenizer = Tokenizer::load(std::string(DEEPINFER_TOKENIZERS) + "/qwen3");
  std::vector<std::string> bytes = tokenizer->token_bytes();
  int32_t eos = *tokenizer->token_to_id("<|im_end|>");
  std::vector<int32_t> control;
  for (int32_t id = 0; id < tokenizer->vocab_size(); ++id)
    if (tokenizer->is_special(id)) control.push_back(id);
  auto table = std::make_shared<TokenTable>(bytes, std::vector<int32_t>{eos}, control);
  auto constraint = json_object_constraint(table);
  std::mt19937 random(7);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  int finished = 0;
  for (int walk = 0; walk < 12; ++walk) {
    auto matcher = constraint->start();
    std::string text;
    for (int step = 0; step < 80; ++step) {
      std::vector<float> logits(bytes.size());
      for (size_t id = 0; id < logits.size(); ++id) {
        const std::string& b = bytes[id];
        bool closes = b.find_first_of("}]\"") != std::string::npos;
        logits[id] = noise(random) + (closes ? 6.0f : 0.0f) + (b.size() == 1 ? 3.0f : 0.0f);
      }
      matcher->mask_logits(logits.data(), static_cast<int32_t>(logits.size()));
      auto best =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ASSERT_FALSE(std::isinf(logits[static_cast<size_t>(best)])) << text;
      ASSERT_TRUE(matcher->accept(best)) << text << " + " << bytes[static_cast<size_t>(best)];
      if (best == eos) break;
      text += bytes[static_cast<size_t>(best)];
    }
    if (!matcher->complete()) continue;
    ++finished;
    nlohmann::json parsed = nlohmann::json::parse(text, nullptr, false);
    EXPECT_TRUE(!parsed.is_discarded() && parsed.is_object()) << text;
  }
  EXPECT_GE(finished, 6);
}

}  // namespace
}  // namespace deepinfer::structured

// Regex and choice constraints: the automaton's language against std::regex (ECMAScript) on
// random strings, UTF-8 classes, the constructs refused by name, and the token masks against
// the automaton itself over a small vocabulary of multi-byte tokens.
#include "structured/regex.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <regex>

#include "structured/structured.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::structured {
namespace {

bool matches(const ByteDfa& dfa, const std::string& text) {
  int state = ByteDfa::kStart;
  for (char c : text) {
    state = dfa.next(state, static_cast<uint8_t>(c));
    if (state == ByteDfa::kDead) return false;
  }
  return dfa.accepting(state);
}

bool matches(const std::string& pattern, const std::string& text) {
  return matches(ByteDfa(RegexTree::parse(pattern)), text);
}

// Patterns in the subset both engines read alike, over the alphabet of the random strings.
TEST(Regex, AgreesWithStdRegexOnRandomStrings) {
  const std::vector<std::string> patterns = {"abc",
                                             "a|b|",
                                             "(ab)*c",
                                             "a+b?c*",
                                             "[a-c]{2,3}",
                                             "[^ab]+",
                                             "a{3}",
                                             "(a|bc){1,}d",
                                             "\\d+(\\.\\d+)?",
                                             "[\\w-]+@x",
                                             "(?:a|b)+?c",
                                             "a.c",
                                             "\\s*a\\s*",
                                             "[a\\-d]+",
                                             "(a*)*b",
                                             "x{0,2}y{2,}",
                                             "[.]|\\.",
                                             "a{0}b",
                                             "(ab)|c",
                                             "^ab$",
                                             "[0-9]{4}-[0-9]{2}",
                                             "-?(0|[1-9]\\d*)"};
  const std::string alphabet = "abcdxy019.-@ _\t";
  std::mt19937 rng(7);
  for (const std::string& pattern : patterns) {
    SCOPED_TRACE(pattern);
    const ByteDfa dfa(RegexTree::parse(pattern));
    const std::regex reference(pattern, std::regex::ECMAScript);
    for (int trial = 0; trial < 400; ++trial) {
      std::string text;
      const int length = static_cast<int>(rng() % 9);
      for (int i = 0; i < length; ++i) text += alphabet[rng() % alphabet.size()];
      EXPECT_EQ(matches(dfa, text), std::regex_match(text, reference)) << "'" << text << "'";
    }
  }
}

// A long bounded repeat after a loop makes a long chain of states (thousands); dead ends are
// pruned from the accepting states backwards, and every state of the chain that can still
// reach a match stays.
TEST(Regex, LongChainsKeepTheirLiveStatesAndLoseTheirDeadEnds) {
  const ByteDfa dfa(RegexTree::parse("(ab|c)*[^\\s\"]e9.{833}$"));
  EXPECT_TRUE(matches(dfa, "abcxe9" + std::string(833, 'x')));
  EXPECT_TRUE(matches(dfa,
                      "\x01"
                      "e9" +
                          std::string(833, '.')));
  EXPECT_FALSE(matches(dfa, "abcxe9" + std::string(832, 'x')));
  EXPECT_FALSE(matches(dfa, "abcxe9" + std::string(834, 'x')));
  EXPECT_FALSE(matches(dfa, " e9" + std::string(833, 'x')));
  const ByteDfa pruned(RegexTree::parse("a[^\\s\\S]b|a{300}c"));
  EXPECT_TRUE(matches(pruned, std::string(300, 'a') + "c"));
  EXPECT_FALSE(matches(pruned, "ab"));
  int state = ByteDfa::kStart;
  for (int i = 0; i < 300; ++i) state = pruned.next(state, 'a');
  EXPECT_EQ(pruned.next(state, 'a'), ByteDfa::kDead);  // no 301st a can lead to a match
}

TEST(Regex, ClassesAndDotSpanWholeUtf8Characters) {
  EXPECT_TRUE(matches(".", "é"));
  EXPECT_TRUE(matches(".", "\xF0\x9F\x98\x80"));  // U+1F600, four bytes
  EXPECT_FALSE(matches(".", "\n"));
  EXPECT_FALSE(matches(".", "\xC3"));  // half a character
  EXPECT_TRUE(matches("[^a]", "ä"));
  EXPECT_TRUE(matches("[α-ω]+", "λόγος") == false);  // ό is outside α-ω
  EXPECT_TRUE(matches("[α-ω]+", "λογος"));
  EXPECT_TRUE(matches("\\u00e9\\u{1F600}", "é\xF0\x9F\x98\x80"));
  EXPECT_TRUE(matches("[\\u0800-\\uFFFF]", "\xE0\xA0\x80"));
  EXPECT_TRUE(matches("[\\u0800-\\uFFFF]", "\xEF\xBF\xBF"));
  EXPECT_FALSE(matches("[\\u0800-\\uFFFF]", "\xDF\xBF"));
  EXPECT_TRUE(matches("\\S+", "日本"));
  EXPECT_TRUE(matches("(?<word>ab)+", "abab"));  // named groups are plain groups
  EXPECT_FALSE(matches("\\S", "\xE3\x80\x80"));  // ideographic space
}

TEST(Regex, RefusesWhatItCannotEnforceByName) {
  auto refusal = [](const std::string& pattern) {
    try {
      ByteDfa dfa(RegexTree::parse(pattern));
    } catch (const GrammarError& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal("a(?=b)").find("look-around"), std::string::npos);
  EXPECT_NE(refusal("(a)\\1").find("back-references"), std::string::npos);
  EXPECT_NE(refusal("\\bword").find("word boundaries"), std::string::npos);
  EXPECT_NE(refusal("a++").find("possessive"), std::string::npos);
  EXPECT_NE(refusal("a{2000}").find("repeat count"), std::string::npos);
  EXPECT_NE(refusal("a{3,2}").find("m < n"), std::string::npos);
  EXPECT_NE(refusal("(ab").find("unterminated group"), std::string::npos);
  EXPECT_NE(refusal("ab)").find("unbalanced"), std::string::npos);
  EXPECT_NE(refusal("a^b").find("'^'"), std::string::npos);
  EXPECT_NE(refusal("*a").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(refusal("[^\\s\\S]").find("matches no string"), std::string::npos);
  EXPECT_NE(refusal("\\p{L}").find("property"), std::string::npos);
  EXPECT_NE(refusal("(.{1000}){1000}").find("automaton states"), std::string::npos);
  EXPECT_NE(refusal("(.{0,100}){0,10}").find("too much work"), std::string::npos);
  EXPECT_NE(refusal(std::string(RegexTree::kMaxPatternBytes + 1, 'a')).find("bytes"),
            std::string::npos);
}

// End token 0, a control token 1, then text tokens of one to four bytes.
const std::vector<std::string> kTokens = {"",   "<ctl>", "a", "b",    "ab",   "abc", "c",   "1",
                                          "12", "-",     "é", "\xC3", "\xA9", "x1",  "bca", "-1"};

std::shared_ptr<const TokenTable> small_table() {
  return std::make_shared<TokenTable>(kTokens, std::vector<int32_t>{0}, std::vector<int32_t>{1});
}

std::vector<bool> allowed(const Matcher& matcher) {
  std::vector<float> logits(kTokens.size() + 3, 0.0f);  // a padded vocabulary
  matcher.mask_logits(logits.data(), static_cast<int32_t>(logits.size()));
  for (size_t id = kTokens.size(); id < logits.size(); ++id) EXPECT_TRUE(std::isinf(logits[id]));
  std::vector<bool> out;
  for (size_t id = 0; id < kTokens.size(); ++id) out.push_back(!std::isinf(logits[id]));
  return out;
}

// Along random walks through the masks, a token is allowed exactly when the automaton can
// read its bytes from the current state (the end token: when the output so far matches).
TEST(RegexConstraint, MasksAreWhatTheAutomatonReads) {
  for (const std::string pattern : {"(ab|c)*-?1{1,3}", "[a-c]+é?", "(bca|x1)+|-1"}) {
    SCOPED_TRACE(pattern);
    const ByteDfa dfa(RegexTree::parse(pattern));
    auto constraint = regex_constraint(small_table(), pattern);
    std::mt19937 rng(3);
    for (int walk = 0; walk < 20; ++walk) {
      auto matcher = constraint->start();
      std::string text;
      for (int step = 0; step < 12; ++step) {
        const std::vector<bool> mask = allowed(*matcher);
        std::vector<int32_t> choices;
        for (size_t id = 0; id < kTokens.size(); ++id) {
          bool expected = false;
          if (id == 0) {
            expected = matches(dfa, text);
          } else if (id > 1) {
            int state = ByteDfa::kStart;
            for (char c : text + kTokens[id]) state = dfa.next(state, static_cast<uint8_t>(c));
            expected = state != ByteDfa::kDead;
          }
          EXPECT_EQ(mask[id], expected) << "after '" << text << "', token '" << kTokens[id] << "'";
          if (mask[id]) choices.push_back(static_cast<int32_t>(id));
        }
        ASSERT_FALSE(choices.empty()) << text;
        const int32_t token = choices[rng() % choices.size()];
        EXPECT_TRUE(matcher->accept(token));
        if (token == 0) {
          EXPECT_TRUE(matches(dfa, text));
          break;
        }
        text += kTokens[static_cast<size_t>(token)];
        EXPECT_EQ(matcher->complete(), matches(dfa, text));
      }
    }
  }
}

TEST(RegexConstraint, ChoicesAllowExactlyTheirTexts) {
  auto matcher = choice_constraint(small_table(), {"ab", "abc", "é1"})->start();
  const std::vector<bool> first = allowed(*matcher);
  EXPECT_TRUE(first[2] && first[4] && first[5] && first[10] && first[11]);  // a ab abc é \xC3
  EXPECT_FALSE(first[0] || first[3] || first[6] || first[7]);
  EXPECT_FALSE(matcher->accept(3));  // "b": no choice starts so; the matcher is unchanged
  EXPECT_TRUE(matcher->accept(4));   // "ab"
  EXPECT_TRUE(matcher->complete());
  const std::vector<bool> then = allowed(*matcher);
  EXPECT_TRUE(then[0] && then[6]);  // end, or "c"
  EXPECT_TRUE(matcher->accept(6));
  EXPECT_EQ(allowed(*matcher),
            (std::vector<bool>{true, false, false, false, false, false, false, false, false, false,
                               false, false, false, false, false, false}));
  EXPECT_THROW(choice_constraint(small_table(), {}), GrammarError);
}

// Over Qwen3's 151k-token vocabulary: greedy walks on random logits through the masks give
// outputs std::regex accepts, and a state's mask is worked out once.
TEST(RegexConstraint, RandomWalksOverARealVocabularyMatch) {
  auto tokenizer = Tokenizer::load(std::string(DEEPINFER_TOKENIZERS) + "/qwen3");
  std::vector<std::string> bytes = tokenizer->token_bytes();
  const int32_t eos = *tokenizer->token_to_id("<|im_end|>");
  std::vector<int32_t> control;
  for (int32_t id = 0; id < tokenizer->vocab_size(); ++id)
    if (tokenizer->is_special(id)) control.push_back(id);
  auto table = std::make_shared<TokenTable>(bytes, std::vector<int32_t>{eos}, control);
  const std::string pattern =
      "(19|20)\\d{2}-(0[1-9]|1[0-2])-\\d{2}T[0-2]\\d:[0-5]\\d( [A-Za-z ]{1,20})?";
  const std::regex reference(pattern, std::regex::ECMAScript);
  auto constraint = regex_constraint(table, pattern);
  std::mt19937 random(11);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  for (int walk = 0; walk < 8; ++walk) {
    auto matcher = constraint->start();
    std::string text;
    bool ended = false;
    for (int step = 0; step < 60 && !ended; ++step) {
      std::vector<float> logits(bytes.size());
      for (float& logit : logits) logit = noise(random);
      logits[static_cast<size_t>(eos)] += 2.0f;
      matcher->mask_logits(logits.data(), static_cast<int32_t>(logits.size()));
      auto best =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ASSERT_FALSE(std::isinf(logits[static_cast<size_t>(best)])) << text;
      ASSERT_TRUE(matcher->accept(best)) << text << " + " << bytes[static_cast<size_t>(best)];
      ended = best == eos;
      if (!ended) text += bytes[static_cast<size_t>(best)];
    }
    ASSERT_TRUE(ended) << text;
    EXPECT_TRUE(std::regex_match(text, reference)) << text;
  }
}

}  // namespace
}  // namespace deepinfer::structured

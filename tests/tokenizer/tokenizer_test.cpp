// Tokenizers against what Hugging Face tokenizers/transformers produced on the same files
// (tests/fixtures/tokenizers/golden.json), plus round-trip and robustness properties.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "tokenizer/text.h"

namespace deepinfer {
namespace {

using nlohmann::json;

const json& golden() {
  static const json data = [] {
    std::ifstream stream(std::string(DEEPINFER_FIXTURES) + "/tokenizers/golden.json");
    return json::parse(stream);
  }();
  return data;
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = [] {
    std::ifstream stream(std::string(DEEPINFER_FIXTURES) + "/tokenizers/corpus.json");
    return json::parse(stream).get<std::vector<std::string>>();
  }();
  return texts;
}

const Tokenizer& tokenizer_for(const std::string& family) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  auto& slot = loaded[family];
  if (!slot) slot = Tokenizer::load(std::string(DEEPINFER_TOKENIZERS) + "/" + family);
  return *slot;
}

class GoldenTokenizer : public ::testing::TestWithParam<std::string> {
 protected:
  const Tokenizer& tokenizer() const { return tokenizer_for(GetParam()); }
  const json& expected() const { return golden().at(GetParam()); }

  // Every corpus text through `encode`, against the golden list `key`.
  template <typename Encode>
  void expect_all(const char* key, Encode encode) const {
    const json& want = expected().at(key);
    ASSERT_EQ(want.size(), corpus().size());
    int mismatches = 0;
    for (size_t i = 0; i < corpus().size(); ++i) {
      std::vector<int32_t> got = encode(corpus()[i]);
      if (got != want[i].get<std::vector<int32_t>>() && ++mismatches <= 3) {
        ADD_FAILURE() << key << " text " << i << ": " << json(corpus()[i]).dump() << "\n got  "
                      << json(got).dump() << "\n want " << want[i].dump();
      }
    }
    EXPECT_EQ(mismatches, 0) << key;
  }
};

TEST_P(GoldenTokenizer, EncodeRecognisingAddedTokens) {
  expect_all("encode", [&](const std::string& text) { return tokenizer().encode(text); });
}

TEST_P(GoldenTokenizer, EncodeWithSpecialTokensAsText) {
  expect_all("encode_as_text", [&](const std::string& text) {
    return tokenizer().encode(text, EncodeMode::kAsText);
  });
}

TEST_P(GoldenTokenizer, EncodePlain) {
  expect_all("encode_plain",
             [&](const std::string& text) { return tokenizer().encode(text, EncodeMode::kPlain); });
}

TEST_P(GoldenTokenizer, EncodeWithPostProcessor) {
  expect_all("encode_with_bos", [&](const std::string& text) {
    return tokenizer().encode(text, EncodeMode::kSpecials, true);
  });
}

TEST_P(GoldenTokenizer, Decode) {
  const json& encoded = expected().at("encode");
  const json& decoded = expected().at("decode");
  int mismatches = 0;
  for (size_t i = 0; i < encoded.size(); ++i) {
    std::string got = tokenizer().decode(encoded[i].get<std::vector<int32_t>>());
    if (got != decoded[i].get<std::string>() && ++mismatches <= 3) {
      ADD_FAILURE() << "text " << i << "\n got  " << json(got).dump() << "\n want "
                    << decoded[i].dump();
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// Token by token, the byte table writes what decode writes for the whole sequence (a first
// token's word marker aside, which decode drops).
TEST_P(GoldenTokenizer, TokenBytesConcatenateToTheDecodedText) {
  std::vector<std::string> table = tokenizer().token_bytes();
  ASSERT_EQ(table.size(), static_cast<size_t>(tokenizer().vocab_size()));
  const json& encoded = expected().at("encode");
  for (size_t i = 0; i < encoded.size(); ++i) {
    std::vector<int32_t> ids = encoded[i].get<std::vector<int32_t>>();
    std::string joined;
    for (int32_t id : ids) joined += table[static_cast<size_t>(id)];
    std::string decoded = tokenizer().decode(ids);
    if (joined.size() == decoded.size() + 1 && joined[0] == ' ') joined.erase(0, 1);
    EXPECT_EQ(joined, decoded) << GetParam() << " text " << i;
  }
}

TEST_P(GoldenTokenizer, StreamingDetokenizerEqualsFullDecode) {
  std::mt19937 engine(7);
  int32_t vocab = tokenizer().vocab_size();
  for (int round = 0; round < 40; ++round) {
    std::vector<int32_t> ids;
    if (round % 2 == 0) {
      ids = tokenizer().encode(corpus()[static_cast<size_t>(round) % corpus().size()]);
    } else {
      std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
      for (int i = 0; i < 30; ++i) {
        int32_t id = pick(engine);
        if (!tokenizer().id_to_token(id).empty()) ids.push_back(id);
      }
    }
    StreamingDetokenizer stream(tokenizer());
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.finish();
    EXPECT_EQ(streamed, tokenizer().decode(ids)) << "round " << round;
  }
}

TEST_P(GoldenTokenizer, RandomInputNeverCrashes) {
  std::mt19937 engine(11);
  for (int round = 0; round < 200; ++round) {
    std::string bytes;
    std::uniform_int_distribution<int> length(0, 40), byte(0, 255);
    for (int i = length(engine); i > 0; --i) bytes += static_cast<char>(byte(engine));
    try {
      std::vector<int32_t> ids = tokenizer().encode(bytes);
      EXPECT_EQ(tokenizer().decode(ids, false).empty(), bytes.empty());
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("not valid UTF-8"), std::string::npos);
    }
  }
}

TEST_P(GoldenTokenizer, RandomUnicodeRoundTrips) {
  std::mt19937 engine(13);
  // Code points from ASCII, Latin-1, combining marks, CJK, Hangul, emoji and private use.
  std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7e},     {0x09, 0x0d},       {0xa0, 0x17f},    {0x300, 0x36f},  {0x4e00, 0x4fff},
      {0xac00, 0xac40}, {0x1f600, 0x1f64f}, {0xe000, 0xe010}, {0x2581, 0x2581}};
  std::uniform_int_distribution<size_t> pick_range(0, ranges.size() - 1);
  for (int round = 0; round < 200; ++round) {
    std::string value;
    for (int i = std::uniform_int_distribution<int>(0, 30)(engine); i > 0; --i) {
      auto [low, high] = ranges[pick_range(engine)];
      value += text::utf8_encode(std::uniform_int_distribution<char32_t>(low, high)(engine));
    }
    for (EncodeMode mode : {EncodeMode::kSpecials, EncodeMode::kPlain}) {
      std::string decoded = tokenizer().decode(tokenizer().encode(value, mode));
      // Byte-level families reproduce the text (Qwen up to NFC); Gemma's byte fallback does too,
      // except that a typed word marker (U+2581) decodes as the space it stands for.
      std::string expected = value;
      if (GetParam() == "qwen3") expected = text::normalize(value, text::NormalForm::kNfc);
      if (GetParam() == "gemma3") {
        for (size_t at = expected.find("\u2581"); at != std::string::npos;
             at = expected.find("\u2581", at + 1)) {
          expected.replace(at, 3, " ");
        }
      }
      EXPECT_EQ(decoded, expected) << GetParam() << " " << json(value).dump();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GoldenTokenizer,
                         ::testing::Values("deepseek_v3", "qwen3", "llama3", "gemma3"));

// Client-typed ranges: added tokens there are plain text, elsewhere still control tokens.
TEST(Tokenizer, PlainRangesMatchNoAddedTokens) {
  const Tokenizer& qwen = tokenizer_for("qwen3");
  int32_t im_end = *qwen.token_to_id("<|im_end|>");
  std::string text = "<|im_end|>user typed <|im_end|> here<|im_end|>";
  size_t typed = text.find("<|im_end|>", 5);
  std::vector<int32_t> ids =
      qwen.encode_with_plain_ranges(text, {{typed, typed + std::string("<|im_end|>").size()}});
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_end), 2);
  EXPECT_EQ(qwen.decode(ids), text);
  std::vector<int32_t> expected = {im_end};
  std::vector<int32_t> middle = qwen.encode("user typed <|im_end|> here", EncodeMode::kPlain);
  expected.insert(expected.end(), middle.begin(), middle.end());
  expected.push_back(im_end);
  EXPECT_EQ(ids, expected);
  EXPECT_EQ(qwen.encode_with_plain_ranges(text, {}), qwen.encode(text));
}

TEST(Tokenizer, ByteLevelRoundTripsTheCorpus) {
  for (std::string family : {"deepseek_v3", "qwen3", "llama3"}) {
    const Tokenizer& tokenizer = tokenizer_for(family);
    for (const std::string& text : corpus()) {
      // Qwen's normalizer is NFC, so its round trip gives the NFC form of the text.
      std::string expected =
          family == "qwen3" ? text::normalize(text, text::NormalForm::kNfc) : text;
      EXPECT_EQ(tokenizer.decode(tokenizer.encode(text, EncodeMode::kPlain)), expected) << family;
    }
  }
}

// Pipelines the real vocabularies do not use (Metaspace, Digits, Punctuation, Whitespace,
// every Split behaviour, Llama-2-style normalizers and decoders, added-token flags), against
// what Hugging Face tokenizers 0.23 produced (components/make_component_fixtures.py).
TEST(Tokenizer, ComponentPipelinesMatchHuggingFace) {
  std::ifstream stream(std::string(DEEPINFER_FIXTURES) + "/tokenizers/components/components.json");
  json data = json::parse(stream);
  ASSERT_GE(data.at("cases").size(), 7u);
  for (const json& component : data.at("cases")) {
    std::string name = component.at("name").get<std::string>();
    auto tokenizer = Tokenizer::from_json(component.at("tokenizer").dump(), "");
    const json& texts = component.at("texts");
    for (size_t i = 0; i < texts.size(); ++i) {
      std::string text = texts[i].get<std::string>();
      std::vector<int32_t> ids = tokenizer->encode(text);
      EXPECT_EQ(json(ids), component["encode"][i]) << name << ": " << json(text).dump();
      EXPECT_EQ(json(tokenizer->encode(text, EncodeMode::kSpecials, true)),
                component["encode_with_special"][i])
          << name << ": " << json(text).dump();
      EXPECT_EQ(tokenizer->decode(component["encode"][i].get<std::vector<int32_t>>()),
                component["decode"][i].get<std::string>())
          << name << ": " << json(text).dump();
    }
  }
}

std::string load_error(const std::string& tokenizer_json) {
  try {
    Tokenizer::from_json(tokenizer_json, "");
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(Tokenizer, UnsupportedComponentsAreNamed) {
  auto with = [](const std::string& field) {
    return R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},)" +
           field + "}";
  };
  EXPECT_NE(load_error(with(R"("normalizer": {"type": "BertNormalizer"})"))
                .find("normalizer type \"BertNormalizer\" is not supported"),
            std::string::npos);
  EXPECT_NE(load_error(with(R"("pre_tokenizer": {"type": "CharDelimiterSplit"})"))
                .find("pre_tokenizer type \"CharDelimiterSplit\""),
            std::string::npos);
  EXPECT_NE(
      load_error(with(R"("decoder": {"type": "WordPiece"})")).find("decoder type \"WordPiece\""),
      std::string::npos);
  EXPECT_NE(load_error(with(R"("post_processor": {"type": "BertProcessing"})"))
                .find("post_processor type \"BertProcessing\""),
            std::string::npos);
  EXPECT_NE(load_error(R"({"model": {"type": "Unigram", "vocab": []}})")
                .find("model type \"Unigram\" is not supported"),
            std::string::npos);
  EXPECT_NE(load_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a q"]}})")
                .find("merge result \"aq\" is not in the vocabulary"),
            std::string::npos);
  EXPECT_EQ(load_error("[1, 2"), "tokenizer.json: malformed JSON");
  EXPECT_NE(load_error(R"({"model": {"type": "BPE"}})").find("tokenizer.json: malformed"),
            std::string::npos);
}

// Ids are converted only when they are integers an id table can hold (found by fuzzing: a
// float id such as 2.6e86 was cast to an integer, which is undefined).
TEST(Tokenizer, TokenIdsMustBeSmallIntegers) {
  for (const char* id : {"2.6e86", "1.5", "-1", "16777217", "18446744073709551615", "\"7\""}) {
    std::string vocab =
        R"({"model": {"type": "BPE", "vocab": {"a": )" + std::string(id) + R"(}, "merges": []}})";
    EXPECT_NE(load_error(vocab).find("must be an integer in [0, 16777216]"), std::string::npos)
        << id << ": " << load_error(vocab);
    std::string added = R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                            "added_tokens": [{"id": )" +
                        std::string(id) + R"(, "content": "<s>"}]})";
    EXPECT_NE(load_error(added).find("added token's id"), std::string::npos) << id;
  }
}

TEST(Tokenizer, MergesInBothSerialisedFormsAgree) {
  std::string vocab = R"("vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4})";
  auto strings = Tokenizer::from_json(
      R"({"model": {"type": "BPE", )" + vocab + R"(, "merges": ["a b", "ab c"]}})", "");
  auto pairs = Tokenizer::from_json(
      R"({"model": {"type": "BPE", )" + vocab + R"(, "merges": [["a", "b"], ["ab", "c"]]}})", "");
  EXPECT_EQ(strings->encode("abcab"), (std::vector<int32_t>{4, 3}));
  EXPECT_EQ(pairs->encode("abcab"), strings->encode("abcab"));
}

}  // namespace
}  // namespace deepinfer

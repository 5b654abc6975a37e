// --speculative-config end to end: generate with a draft model gives the tokens it gives
// without one, and drafts that do not share the target's tokenizer, missing folders and
// malformed settings are refused with a message and a non-zero exit.
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::fixture_model;
using testing::run_command;
using testing::TempDir;

const std::string kBinary = DEEPINFER_BINARY;

std::string generate(const std::string& target, const std::string& config) {
  std::string command =
      fmt::format("{} generate {} --prompt-ids 5,17,99,300,12,45 --max-tokens 20 --ignore-eos",
                  kBinary, fixture_model(target).string());
  if (!config.empty()) command += " --speculative-config '" + config + "'";
  return command;
}

std::string draft_config(const std::filesystem::path& draft) {
  return fmt::format(R"({{"method": "draft_model", "model": "{}", "num_speculative_tokens": 4}})",
                     draft.string());
}

TEST(CliSpeculative, GenerateWithADraftModelGivesThePlainTokens) {
  auto plain = run_command(generate("demo-code-target", ""));
  auto drafted =
      run_command(generate("demo-code-target", draft_config(fixture_model("demo-code-draft"))));
  auto ngram = run_command(generate("demo-code-target", R"({"method": "ngram"})"));
  ASSERT_EQ(plain.status, 0) << plain.output;
  ASSERT_EQ(drafted.status, 0) << drafted.output;
  ASSERT_EQ(ngram.status, 0) << ngram.output;
  EXPECT_EQ(drafted.output, plain.output);
  EXPECT_EQ(ngram.output, plain.output);
}

void expect_refused(const std::string& command, const std::string& message) {
  auto result = run_command(command);
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_NE(result.output.find(message), std::string::npos) << result.output;
}

TEST(CliSpeculative, DraftsOfAnotherVocabularyAndBadSettingsAreRefused) {
  // Sizes differ (no tokenizer.json on one side).
  expect_refused(generate("demo-code-target", draft_config(fixture_model("tiny-qwen3-chat"))),
                 "the draft model's vocabulary has 151936 tokens, the target's 8192");
  // Sizes agree, one token differs.
  TempDir dir;
  const std::filesystem::path renamed = dir.path() / "renamed";
  std::filesystem::copy(fixture_model("demo-code-draft"), renamed);
  nlohmann::json tokenizer = nlohmann::json::parse(std::ifstream(renamed / "tokenizer.json"));
  nlohmann::json& vocab = tokenizer["model"]["vocab"];
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (it.value() != 100) continue;
    const std::string token = it.key();
    vocab.erase(token);
    vocab[token + "x"] = 100;
    break;
  }
  std::ofstream(renamed / "tokenizer.json") << tokenizer.dump();
  expect_refused(generate("demo-code-target", draft_config(renamed)),
                 "the draft model's tokenizer differs from the target's: token 100");
  expect_refused(generate("demo-code-target", draft_config(dir.path() / "missing")),
                 "is not a directory");
  expect_refused(generate("demo-code-target", R"({"method": "draft_model"})"),
                 "the draft_model method needs 'model'");
  expect_refused(generate("demo-code-target", R"({"method": "eagle"})"),
                 "speculative method 'eagle' is not one of: ngram, draft_model");
  expect_refused(generate("demo-code-target", R"({"method": "ngram", "confidence_threshold": 2})"),
                 "confidence_threshold 2 is not in [0, 1)");
}

}  // namespace
}  // namespace deepinfer

// The deepinfer binary end to end: what a user types and what comes back.
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "kernels/ops.h"
#include "model/model.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::fixture_model;
using testing::run_command;
using testing::TempDir;

const std::string kBinary = DEEPINFER_BINARY;

std::string joined(const std::vector<int32_t>& ids, const char* separator) {
  return fmt::format("{}", fmt::join(ids, separator));
}

TEST(Cli, LogitsWritesEveryPositionMatchingTransformers) {
  TempDir dir;
  SafetensorsFile reference(fixture_model("llama-gqa") / "reference.safetensors", LoadMode::kRead);
  std::vector<int32_t> ids = testing::as_ids(reference.tensors().at("case1.input_ids"));
  std::string out = (dir.path() / "logits.safetensors").string();
  auto result =
      run_command(fmt::format("{} logits {} --ids {} --out {}", kBinary,
                              fixture_model("llama-gqa").string(), joined(ids, ","), out));
  ASSERT_EQ(result.status, 0) << result.output;
  SafetensorsFile written(out, LoadMode::kRead);
  const Tensor& logits = written.tensors().at("logits");
  EXPECT_EQ(logits.shape_string(), fmt::format("[{}, 512]", ids.size()));
  std::vector<float> expected = testing::as_floats(reference.tensors().at("case1.logits"));
  EXPECT_LE(testing::max_abs_difference(logits.as<const float>(), expected.data(), expected.size()),
            1e-3f);
}

TEST(Cli, GeneratePrintsGreedyIdsOnOneLine) {
  SafetensorsFile reference(fixture_model("llama-gqa") / "reference.safetensors", LoadMode::kRead);
  std::vector<int32_t> prompt = testing::as_ids(reference.tensors().at("greedy.prompt"));
  std::vector<int32_t> expected = testing::as_ids(reference.tensors().at("greedy.tokens"));
  auto result = run_command(
      fmt::format("{} generate {} --prompt-ids {} --max-tokens 24 --temperature 0 --output ids "
                  "--ignore-eos",
                  kBinary, fixture_model("llama-gqa").string(), joined(prompt, ",")));
  ASSERT_EQ(result.status, 0) << result.output;
  EXPECT_EQ(result.output, joined(expected, " ") + "\n");
}

TEST(Cli, SeededSamplingRepeatsAndParametersAreChecked) {
  std::string command = fmt::format(
      "{} generate {} --prompt-ids 1,2,3 --max-tokens 12 --ignore-eos --temperature 0.9 "
      "--top-k 50 --top-p 0.95 --min-p 0.01 --repetition-penalty 1.1 --seed ",
      kBinary, fixture_model("llama-gqa").string());
  auto first = run_command(command + "11");
  auto again = run_command(command + "11");
  auto other = run_command(command + "12");
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_EQ(first.output, again.output);
  EXPECT_NE(first.output, other.output);
  auto bad = run_command(fmt::format("{} generate {} --prompt-ids 1 --min-p 3", kBinary,
                                     fixture_model("llama-gqa").string()));
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("min_p must be in [0, 1], got 3"), std::string::npos) << bad.output;
}

// Runs `generate --input` over `requests` (JSONL lines) in `dir`; the result lines.
std::vector<nlohmann::json> offline_batch(const std::string& model, const TempDir& dir,
                                          const std::string& requests) {
  const std::string input = (dir.path() / "requests.jsonl").string();
  const std::string output = (dir.path() / "results.jsonl").string();
  std::ofstream(input) << requests;
  auto batch = run_command(
      fmt::format("{} generate {} --input {} --output {}", kBinary, model, input, output));
  EXPECT_EQ(batch.status, 0) << batch.output;
  std::ifstream results(output);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(results, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(Cli, OfflineBatchMatchesSinglePromptsAndHonoursStops) {
  TempDir dir;
  std::string model = fixture_model("demo-code-target").string();
  std::string input = (dir.path() / "requests.jsonl").string();
  std::string output = (dir.path() / "results.jsonl").string();
  std::vector<nlohmann::json> lines = offline_batch(
      model, dir,
      R"({"id": "ids", "prompt_token_ids": [327, 3005, 306, 811], "max_tokens": 6, "temperature": 0, "ignore_eos": true}
{"id": "text", "prompt": "def add(a, b):", "max_tokens": 20, "temperature": 0, "stop": ["return"]}
{"id": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0.8, "seed": 5}
{"id": "three", "prompt": "def add(a, b):", "max_tokens": 3, "temperature": 0.8, "seed": 9, "n": 3, "logprobs": true, "top_logprobs": 2, "prompt_logprobs": 1}
)");
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["id"], "ids");
  EXPECT_EQ(lines[2]["id"], "chat");
  auto single = run_command(fmt::format(
      "{} generate {} --prompt-ids 327,3005,306,811 --max-tokens 6 --ignore-eos", kBinary, model));
  std::string joined_ids;
  for (const auto& id : lines[0]["choices"][0]["token_ids"])
    joined_ids += (joined_ids.empty() ? "" : " ") + std::to_string(id.get<int>());
  EXPECT_EQ(single.output, joined_ids + "\n");
  const nlohmann::json& text = lines[1]["choices"][0];
  if (text["finish_reason"] == "stop") {
    EXPECT_EQ(text["text"].get<std::string>().find("return"), std::string::npos);
    EXPECT_EQ(text["stop_reason"], "return");
  }
  EXPECT_EQ(lines[2]["usage"]["completion_tokens"], 4);
  // n = 3 completions in index order, each with a logprob and 2 alternatives per token; the
  // prompt's logprobs start with null for its first token.
  const nlohmann::json& three = lines[3];
  ASSERT_EQ(three["choices"].size(), 3u);
  EXPECT_EQ(three["usage"]["completion_tokens"], 9);
  for (int c = 0; c < 3; ++c) {
    const nlohmann::json& choice = three["choices"][c];
    EXPECT_EQ(choice["index"], c);
    ASSERT_EQ(choice["logprobs"].size(), 3u);
    EXPECT_EQ(choice["logprobs"][0]["top_logprobs"].size(), 2u);
    EXPECT_LE(choice["logprobs"][0]["logprob"].get<double>(), 0.0);
  }
  int64_t prompt_tokens = three["usage"]["prompt_tokens"].get<int64_t>();
  ASSERT_EQ(three["prompt_logprobs"].size(), static_cast<size_t>(prompt_tokens));
  EXPECT_TRUE(three["prompt_logprobs"][0].is_null());

  std::ofstream(input) << R"({"prompt": "x", "prompt_token_ids": [1]})"
                       << "\n";
  auto bad = run_command(
      fmt::format("{} generate {} --input {} --output {}", kBinary, model, input, output));
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("--input line 1"), std::string::npos) << bad.output;
}

// Offline lines take the server's output constraints: json_object, regex and choice hold in
// what they produce; a pattern the engine refuses and a kind not built yet end the run with
// the line's message.
TEST(Cli, OfflineBatchConstrainsOutput) {
  TempDir dir;
  std::string model = fixture_model("demo-code-target").string();
  std::string input = (dir.path() / "requests.jsonl").string();
  std::string output = (dir.path() / "results.jsonl").string();
  std::vector<nlohmann::json> lines = offline_batch(
      model, dir,
      R"({"id": "json", "prompt": "x =", "max_tokens": 60, "temperature": 1.0, "seed": 2, "response_format": {"type": "json_object"}}
{"id": "regex", "prompt": "x =", "max_tokens": 30, "temperature": 1.0, "seed": 3, "structured_outputs": {"regex": "v[0-9]{1,2}\\.[0-9]"}}
{"id": "choice", "messages": [{"role": "user", "content": "hi"}], "temperature": 1.0, "seed": 4, "guided_choice": ["red", "green"]}
{"id": "schema", "prompt": "x =", "max_tokens": 60, "temperature": 1.0, "seed": 5, "guided_json": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": false}}
{"id": "grammar", "prompt": "x =", "max_tokens": 30, "temperature": 1.0, "seed": 6, "structured_outputs": {"grammar": "root ::= item (\", \" item){0,2}\nitem ::= [a-c]{1,3} | \"[\" root \"]\""}}
)");
  ASSERT_EQ(lines.size(), 5u);
  const nlohmann::json& json = lines[0]["choices"][0];
  if (json["finish_reason"] == "stop") {
    nlohmann::json parsed = nlohmann::json::parse(json["text"].get<std::string>(), nullptr, false);
    EXPECT_TRUE(parsed.is_object()) << json["text"];
  }
  EXPECT_TRUE(std::regex_match(lines[1]["choices"][0]["text"].get<std::string>(),
                               std::regex("v[0-9]{1,2}\\.[0-9]")))
      << lines[1];
  const std::string color = lines[2]["choices"][0]["text"];
  EXPECT_TRUE(color == "red" || color == "green") << color;
  const nlohmann::json& schema = lines[3]["choices"][0];
  if (schema["finish_reason"] == "stop") {
    nlohmann::json parsed =
        nlohmann::json::parse(schema["text"].get<std::string>(), nullptr, false);
    EXPECT_TRUE(parsed.is_object() && parsed.size() == 1 && parsed["n"].is_number_integer())
        << schema["text"];
  }
  const nlohmann::json& grammar = lines[4]["choices"][0];
  EXPECT_EQ(grammar["finish_reason"], "stop") << grammar;
  {
    // Items of one to three of a-c, or bracketed lists of them, one to three a list.
    std::string text = grammar["text"];
    const std::regex flat("[a-c]{1,3}(, [a-c]{1,3}){0,2}");
    const std::regex innermost(R"(\[[a-c]{1,3}(, [a-c]{1,3}){0,2}\])");
    for (std::string reduced; (reduced = std::regex_replace(text, innermost, "a")) != text;)
      text = reduced;
    EXPECT_TRUE(std::regex_match(text, flat)) << grammar["text"];
  }

  for (const char* line : {R"({"prompt": "x", "guided_regex": "(a)\\1"})",
                           R"({"prompt": "x", "guided_json": {"if": {"type": "object"}}})",
                           R"({"prompt": "x", "response_format": {"type": "json_schema"}})",
                           R"({"prompt": "x", "guided_grammar": "root ::= [z-a]"})"}) {
    std::ofstream(input) << line << "\n";
    auto bad = run_command(
        fmt::format("{} generate {} --input {} --output {}", kBinary, model, input, output));
    EXPECT_EQ(bad.status, 1) << line;
    EXPECT_TRUE(bad.output.find("back-references") != std::string::npos ||
                bad.output.find("--input line 1") != std::string::npos ||
                bad.output.find("keyword 'if'") != std::string::npos ||
                bad.output.find("runs backwards") != std::string::npos)
        << bad.output;
  }
}

TEST(Cli, MakeModelWritesLoadableCheckpointsForEveryFamily) {
  TempDir dir;
  for (const char* family : {"llama", "mistral", "qwen2", "qwen3"}) {
    std::string folder = (dir.path() / family).string();
    auto made = run_command(fmt::format(
        "{} make-model --family {} --vocab 300 --hidden 64 --intermediate 96 --layers 2 "
        "--heads 4 --kv-heads 2 --sliding-window 8 --max-shard-mib 1 {}",
        kBinary, family, folder));
    ASSERT_EQ(made.status, 0) << made.output;
    auto generated = run_command(fmt::format(
        "{} generate {} --prompt-ids 1,2,3 --max-tokens 5 --ignore-eos", kBinary, folder));
    ASSERT_EQ(generated.status, 0) << generated.output;
    EXPECT_EQ(std::count(generated.output.begin(), generated.output.end(), ' '), 4)
        << generated.output;
  }
  // 300 x 64 bf16 tables and 2 layers exceed one 1 MiB shard only with the index path.
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "llama" / "model.safetensors") ||
              std::filesystem::exists(dir.path() / "llama" / "model.safetensors.index.json"));
}

TEST(Cli, MakeModelWritesDeepseekCheckpointsInBf16AndFp8) {
  TempDir dir;
  for (const char* family : {"deepseek_v2", "deepseek_v3"}) {
    for (const char* dtype : {"bf16", "fp8"}) {
      std::string folder = (dir.path() / (std::string(family) + dtype)).string();
      auto made = run_command(fmt::format(
          "{} make-model --family {} --dtype {} --vocab 300 --hidden 64 --intermediate 96 "
          "--layers 2 --heads 4 --q-lora-rank 24 --kv-lora-rank 32 --qk-nope-dim 16 "
          "--qk-rope-dim 8 --v-head-dim 16 --experts 8 --experts-per-token 2 "
          "--moe-intermediate 32 --expert-groups 2 --topk-groups 1 --mtp-layers 1 {}",
          kBinary, family, dtype, folder));
      ASSERT_EQ(made.status, 0) << made.output;
      for (const char* cache : {"latent", "expanded"}) {
        auto generated =
            run_command(fmt::format("{} generate {} --prompt-ids 1,2,3 --max-tokens 5 --ignore-eos "
                                    "--mla-cache {}",
                                    kBinary, folder, cache));
        ASSERT_EQ(generated.status, 0) << generated.output;
        EXPECT_EQ(std::count(generated.output.begin(), generated.output.end(), ' '), 4);
      }
    }
  }
  auto dense_fp8 = run_command(fmt::format("{} make-model --family llama --dtype fp8 {}", kBinary,
                                           (dir.path() / "llama").string()));
  EXPECT_NE(dense_fp8.status, 0);
  EXPECT_NE(dense_fp8.output.find("fp8 for the deepseek families"), std::string::npos)
      << dense_fp8.output;
}

TEST(Cli, ShardedMakeModelWritesAnIndex) {
  TempDir dir;
  std::string folder = (dir.path() / "sharded").string();
  auto made = run_command(
      fmt::format("{} make-model --family qwen3 --vocab 8000 --hidden 128 --intermediate 256 "
                  "--layers 4 --heads 4 --kv-heads 1 --max-shard-mib 1 {}",
                  kBinary, folder));
  ASSERT_EQ(made.status, 0) << made.output;
  EXPECT_TRUE(
      std::filesystem::exists(std::filesystem::path(folder) / "model.safetensors.index.json"));
  auto ops = make_cpu_ops();
  auto model = load_model(folder, LoadMode::kMmap, *ops);
  EXPECT_EQ(model->config().num_kv_heads, 1);
}

TEST(Cli, TokenizeAndDetokenizeInEveryMode) {
  std::string dir = std::string(DEEPINFER_TOKENIZERS) + "/qwen3";
  auto specials = run_command(
      fmt::format("{} tokenize {} --text 'Hello <|im_start|> world' --json", kBinary, dir));
  ASSERT_EQ(specials.status, 0) << specials.output;
  EXPECT_EQ(specials.output, "[9707,220,151644,1879]\n");
  auto plain = run_command(fmt::format(
      "{} tokenize {} --text 'Hello <|im_start|> world' --mode plain --json", kBinary, dir));
  EXPECT_EQ(plain.output.find("151644"), std::string::npos) << plain.output;
  auto decoded =
      run_command(fmt::format("{} detokenize {} --ids 9707,220,151644,1879", kBinary, dir));
  EXPECT_EQ(decoded.output, "Hello <|im_start|> world");
  auto with_bos = run_command(
      fmt::format("{} tokenize {}/../llama3 --text hi --with-bos --json", kBinary, dir));
  EXPECT_EQ(with_bos.output, "[128000,6151]\n");
  auto bad =
      run_command(fmt::format("{} tokenize {} --text-file {}/tokenizers/golden.json --text x",
                              kBinary, dir, DEEPINFER_FIXTURES));
  EXPECT_NE(bad.status, 0);
  auto out_of_vocab = run_command(fmt::format("{} detokenize {} --ids 99999999", kBinary, dir));
  EXPECT_EQ(out_of_vocab.status, 1);
  EXPECT_NE(out_of_vocab.output.find("outside the vocabulary"), std::string::npos);
}

TEST(Cli, RenderChatPrintsThePrompt) {
  TempDir dir;
  std::string messages = (dir.path() / "messages.json").string();
  std::ofstream(messages) << R"([{"role": "user", "content": "Hi"}])";
  std::string qwen = std::string(DEEPINFER_TOKENIZERS) + "/qwen3";
  auto rendered = run_command(fmt::format(
      "{} render-chat {} --messages {} --add-generation-prompt --var enable_thinking=false",
      kBinary, qwen, messages));
  ASSERT_EQ(rendered.status, 0) << rendered.output;
  EXPECT_EQ(rendered.output,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  auto bad_var = run_command(fmt::format(
      "{} render-chat {} --messages {} --var enable_thinking=nope", kBinary, qwen, messages));
  EXPECT_EQ(bad_var.status, 1);
  EXPECT_NE(bad_var.output.find("is not JSON"), std::string::npos) << bad_var.output;
  std::string gemma = std::string(DEEPINFER_TOKENIZERS) + "/gemma3";
  std::ofstream(messages) << R"([{"role": "assistant", "content": "Hi"}])";
  auto raised =
      run_command(fmt::format("{} render-chat {} --messages {}", kBinary, gemma, messages));
  EXPECT_EQ(raised.status, 1);
  EXPECT_NE(raised.output.find("Conversation roles must alternate"), std::string::npos);
}

TEST(Cli, BadInputGivesAMessageAndNonZeroExit) {
  std::string model = fixture_model("llama-gqa").string();
  auto bad_ids = run_command(fmt::format("{} generate {} --prompt-ids 1,x,3", kBinary, model));
  EXPECT_EQ(bad_ids.status, 1);
  EXPECT_NE(bad_ids.output.find("--prompt-ids: \"x\" is not a token id"), std::string::npos)
      << bad_ids.output;
  auto out_of_vocab =
      run_command(fmt::format("{} generate {} --prompt-ids 1,99999", kBinary, model));
  EXPECT_EQ(out_of_vocab.status, 1);
  EXPECT_NE(out_of_vocab.output.find("outside the vocabulary (size 512)"), std::string::npos)
      << out_of_vocab.output;
  auto missing_dir =
      run_command(fmt::format("{} logits /nonexistent --ids 1 --out /tmp/x", kBinary));
  EXPECT_NE(missing_dir.status, 0);
  auto no_command = run_command(kBinary);
  EXPECT_NE(no_command.status, 0);
}

TEST(Cli, BenchEngineKeepsTheBatchFullForEveryPrompt) {
  auto run = run_command(fmt::format(
      "{} bench-engine {} --concurrency 2 --num-prompts 5 --prompt-tokens 6 --output-tokens 3 "
      "--json",
      kBinary, fixture_model("llama-gqa").string()));
  ASSERT_EQ(run.status, 0) << run.output;
  nlohmann::json report = nlohmann::json::parse(run.output.substr(run.output.find('{')));
  const nlohmann::json& throughput = report["throughput"].at(0);
  EXPECT_EQ(throughput["concurrency"], 2);
  EXPECT_EQ(throughput["requests"], 5);
  EXPECT_EQ(throughput["output_tokens"], 15);
  // Two at a time: at least three rounds of three decode steps.
  EXPECT_GE(throughput["steps"].get<int>(), 9);
}

TEST(Cli, BenchEngineTakesPromptTokenIdsWithoutATokenizer) {
  TempDir dir;
  const std::string model = fixture_model("llama-gqa").string();  // no tokenizer files
  std::ofstream(dir.path() / "ids.jsonl") << "{\"prompt_token_ids\": [1, 2, 3, 1, 2, 3]}\n\n"
                                          << "{\"prompt_token_ids\": [5, 6]}\n";
  auto run = run_command(
      fmt::format("{} bench-engine {} --concurrency 2 --output-tokens 2 --dataset-path {} --json",
                  kBinary, model, (dir.path() / "ids.jsonl").string()));
  ASSERT_EQ(run.status, 0) << run.output;
  nlohmann::json report = nlohmann::json::parse(run.output.substr(run.output.find('{')));
  EXPECT_EQ(report["throughput"].at(0)["output_tokens"], 4);
  // 8 prompt tokens and 4 output tokens.
  EXPECT_NEAR(report["throughput"].at(0)["total_tokens_per_s"].get<double>() /
                  report["throughput"].at(0)["output_tokens_per_s"].get<double>(),
              3.0, 1e-9);

  std::ofstream(dir.path() / "bad.jsonl") << "{\"prompt_token_ids\": [1, 512]}\n";
  auto bad = run_command(fmt::format("{} bench-engine {} --dataset-path {}", kBinary, model,
                                     (dir.path() / "bad.jsonl").string()));
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("line 1: token id 512 is outside the vocabulary (size 512)"),
            std::string::npos)
      << bad.output;
}

TEST(Cli, RouterRefusesMissingAndMalformedWorkers) {
  auto none = run_command(fmt::format("{} router --port 0", kBinary));
  EXPECT_NE(none.status, 0);
  EXPECT_NE(none.output.find("--worker-urls is required"), std::string::npos) << none.output;
  auto malformed =
      run_command(fmt::format("{} router --port 0 --worker-urls localhost:8000", kBinary));
  EXPECT_EQ(malformed.status, 1);
  EXPECT_NE(
      malformed.output.find("localhost:8000 is not a worker URL of the form http://HOST:PORT"),
      std::string::npos)
      << malformed.output;
}

TEST(Cli, EveryCommandHasHelp) {
  for (const char* command : {"", "logits", "generate", "make-model", "bench", "tokenize",
                              "detokenize", "render-chat", "bench-engine", "router"}) {
    auto help = run_command(fmt::format("{} {} --help", kBinary, command));
    EXPECT_EQ(help.status, 0) << command;
    EXPECT_NE(help.output.find("Options:"), std::string::npos) << command << help.output;
  }
}

}  // namespace
}  // namespace deepinfer

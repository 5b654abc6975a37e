// --speculative-config: the speculative decoding settings as JSON, spelled as vLLM spells them.
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {

SpeculativeConfig parse_speculative_config(const std::string& text) {
  nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded() || !json.is_object())
    fail("--speculative-config: '{}' is not a JSON object", text);
  SpeculativeConfig config;
  auto count = [&](const std::string& key, const nlohmann::json& value) {
    if (!value.is_number_integer())
      fail("--speculative-config: '{}' must be a whole number, not {}", key, value.dump());
    return value.get<int>();
  };
  for (const auto& [key, value] : json.items()) {
    if (key == "num_speculative_tokens") {
      config.num_speculative_tokens = count(key, value);
    } else if (key == "prompt_lookup_min") {
      config.prompt_lookup_min = count(key, value);
    } else if (key == "prompt_lookup_max") {
      config.prompt_lookup_max = count(key, value);
    } else if (key == "verification" || key == "model" || key == "method") {
      if (!value.is_string()) fail("--speculative-config: '{}' must be a string", key);
      (key == "model"    ? config.model
       : key == "method" ? config.method
                         : config.verification) = value.get<std::string>();
    } else if (key == "confidence_threshold") {
      if (!value.is_number())
        fail("--speculative-config: 'confidence_threshold' must be a number, not {}", value.dump());
      config.confidence_threshold = value.get<double>();
    } else {
      fail(
          "--speculative-config: '{}' is not supported (known: method, model, "
          "num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, confidence_threshold, "
          "verification)",
          key);
    }
  }
  if (config.method.empty())
    fail("--speculative-config: 'method' is required (ngram, draft_model or mtp)");
  try {
    config.validate();
  } catch (const Error& error) {
    fail("--speculative-config: {}", error.what());
  }
  return config;
}

CLI::Option* add_speculative_option(CLI::App& command, EngineConfig& engine,
                                    const std::string& prefix) {
  std::string help =
      prefix + (prefix.empty() ? "Speculative" : "speculative") +
      " decoding as JSON; the output follows the model's distribution as without it (greedy: the "
      "same tokens). {\"method\": \"ngram\", "
      "\"num_speculative_tokens\": 5, \"prompt_lookup_min\": 1, \"prompt_lookup_max\": "
      "4}: drafts are the tokens that followed an earlier occurrence of the last few tokens; "
      "{\"method\": \"draft_model\", \"model\": DIR, \"confidence_threshold\": 0.05}: a "
      "smaller model with the same vocabulary drafts, each sequence until its confidence "
      "in its drafts falls below the threshold; {\"method\": \"mtp\"}: the model's own "
      "multi-token-prediction module (DeepSeek's num_nextn_predict_layers) drafts from its "
      "hidden states, chained for several tokens. \"verification\": \"adaptive\" (default: "
      "as many drafts as the measured step cost and the drafts' acceptance make worth it) "
      "or \"always\"";
  return command.add_option_function<std::string>(
      "--speculative-config",
      [&engine](const std::string& text) { engine.speculative = parse_speculative_config(text); },
      help);
}

void prepare_speculative(const EngineConfig& engine, const ModelOptions& options) {
  const SpeculativeConfig& speculative = engine.speculative;
  if (speculative.method != "draft_model") return;
  const std::filesystem::path draft = speculative.model;
  if (!std::filesystem::is_directory(draft))
    fail("--speculative-config: the draft model {} is not a directory", speculative.model);
  const std::filesystem::path target = options.model_dir;
  if (!std::filesystem::exists(target / "tokenizer.json") ||
      !std::filesystem::exists(draft / "tokenizer.json")) {
    // Without both tokenizers only the sizes tell (a padded vocabulary then looks different).
    const int64_t ours = load_model_config(target).vocab_size;
    const int64_t theirs = load_model_config(draft).vocab_size;
    if (ours != theirs)
      fail(
          "--speculative-config: the draft model's vocabulary has {} tokens, the target's {} "
          "(a draft must share the target's tokenizer)",
          theirs, ours);
    return;
  }
  std::unique_ptr<Tokenizer> ours = Tokenizer::load(target);
  std::unique_ptr<Tokenizer> theirs = Tokenizer::load(draft);
  if (ours->vocab_size() != theirs->vocab_size())
    fail("--speculative-config: the draft model's tokenizer has {} tokens, the target's {}",
         theirs->vocab_size(), ours->vocab_size());
  for (int32_t id = 0; id < ours->vocab_size(); ++id) {
    if (ours->id_to_token(id) != theirs->id_to_token(id))
      fail(
          "--speculative-config: the draft model's tokenizer differs from the target's: token "
          "{} is '{}' there and '{}' here",
          id, theirs->id_to_token(id), ours->id_to_token(id));
  }
}

}  // namespace deepinfer::cli

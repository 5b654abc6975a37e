// --speculative-config: the speculative decoding settings as JSON, spelled as vLLM spells them.
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"

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
    if (key == "method") {
      if (!value.is_string()) fail("--speculative-config: 'method' must be a string");
      config.method = value.get<std::string>();
    } else if (key == "num_speculative_tokens") {
      config.num_speculative_tokens = count(key, value);
    } else if (key == "prompt_lookup_min") {
      config.prompt_lookup_min = count(key, value);
    } else if (key == "prompt_lookup_max") {
      config.prompt_lookup_max = count(key, value);
    } else if (key == "verification") {
      if (!value.is_string()) fail("--speculative-config: 'verification' must be a string");
      config.verification = value.get<std::string>();
    } else {
      fail(
          "--speculative-config: '{}' is not supported (known: method, num_speculative_tokens, "
          "prompt_lookup_min, prompt_lookup_max, verification)",
          key);
    }
  }
  if (config.method.empty()) fail("--speculative-config: 'method' is required (ngram)");
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
      " decoding as JSON, for example {\"method\": \"ngram\", "
      "\"num_speculative_tokens\": 5, \"prompt_lookup_max\": 4}: requests verify "
      "tokens that followed an earlier occurrence of their last few tokens, with the same "
      "output as without (off with --async-scheduling); \"verification\": \"adaptive\" "
      "(default: as many drafts as the measured step cost and each request's acceptance "
      "make worth it) or \"always\"";
  return command.add_option_function<std::string>(
      "--speculative-config",
      [&engine](const std::string& text) { engine.speculative = parse_speculative_config(text); },
      help);
}

}  // namespace deepinfer::cli

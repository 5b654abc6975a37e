// generate --input requests.jsonl --output results.jsonl: offline batches through the engine.
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/batch.h"
#include "core/error.h"
#include "core/json.h"
#include "engine/engine.h"
#include "protocol/chat_encoder.h"
#include "protocol/completion_text.h"
#include "protocol/openai.h"
#include "protocol/output_constraints.h"
#include "protocol/prompt.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {
namespace {

using Json = nlohmann::ordered_json;

// One input line, resolved to tokens and parameters.
struct OfflineRequest {
  GenerationRequest request;
  std::vector<std::string> stop_strings;
  // Its output constraint, as the server reads it (response_format json_object,
  // structured_outputs, guided_*), and the reasoning tags of a chat prompt.
  protocol::GenerationParams constraint;
  protocol::OutputSyntax syntax;
};

// response_format and the structured-output fields, checked as the server checks them.
void read_constraint(const Json& line, int n, protocol::GenerationParams& params) {
  try {
    if (auto format = line.find("response_format"); format != line.end() && !format->is_null()) {
      const std::string type =
          format->is_object() ? protocol::string_field(*format, "type", "response_format") : "";
      if (type == "json_object") {
        params.json_output = true;
      } else if (type != "text") {
        fail(
            "--input line {}: response_format '{}' is not supported: 'text' and 'json_object' "
            "are",
            n, type);
      }
    }
    protocol::read_structured_output(line, params);
  } catch (const protocol::ApiError& error) {
    fail("--input line {}: {}", n, error.what());
  }
}

template <typename T>
void read_field(const Json& line, const char* key, T& target, int line_number) {
  if (!line.contains(key) || line[key].is_null()) return;
  try {
    target = line[key].get<T>();
  } catch (const nlohmann::json::exception&) {
    fail("--input line {}: field \"{}\" has the wrong type ({})", line_number, key,
         line[key].dump());
  }
}

sampling::SamplingParams read_sampling(const Json& line, int n) {
  sampling::SamplingParams p;
  read_field(line, "temperature", p.temperature, n);
  read_field(line, "top_k", p.top_k, n);
  read_field(line, "top_p", p.top_p, n);
  read_field(line, "min_p", p.min_p, n);
  read_field(line, "repetition_penalty", p.repetition_penalty, n);
  read_field(line, "presence_penalty", p.presence_penalty, n);
  read_field(line, "frequency_penalty", p.frequency_penalty, n);
  read_field(line, "n", p.n, n);
  read_field(line, "logprobs", p.logprobs, n);
  read_field(line, "top_logprobs", p.top_logprobs, n);
  read_field(line, "prompt_logprobs", p.prompt_logprobs, n);
  uint64_t seed = 0;
  if (line.contains("seed") && !line["seed"].is_null()) {
    read_field(line, "seed", seed, n);
    p.seed = seed;
  }
  if (line.contains("logit_bias") && line["logit_bias"].is_object()) {
    for (const auto& [token, bias] : line["logit_bias"].items()) {
      try {
        p.logit_bias.emplace_back(std::stoi(token), bias.get<float>());
      } catch (const std::exception&) {
        fail("--input line {}: logit_bias entry \"{}\" is not token id -> number", n, token);
      }
    }
  }
  return p;
}

OfflineRequest parse_line(const std::string& text, int n, const Tokenizer* tokenizer,
                          const protocol::ChatEncoder* chat) {
  Json line = parse_json_or_discarded<Json>(text);
  if (line.is_discarded() || !line.is_object()) fail("--input line {}: not a JSON object", n);
  int sources =
      line.contains("prompt") + line.contains("messages") + line.contains("prompt_token_ids");
  if (sources != 1)
    fail("--input line {}: give exactly one of \"prompt\", \"messages\", \"prompt_token_ids\"", n);
  OfflineRequest out;
  GenerationRequest& r = out.request;
  r.id = line.contains("id")
             ? (line["id"].is_string() ? line["id"].get<std::string>() : line["id"].dump())
             : std::to_string(n);
  if (line.contains("prompt_token_ids")) {
    read_field(line, "prompt_token_ids", r.prompt, n);
  } else {
    if (!tokenizer) fail("--input line {}: text prompts need the model folder's tokenizer.json", n);
    if (line.contains("prompt")) {
      std::string prompt;
      read_field(line, "prompt", prompt, n);
      r.prompt = tokenizer->encode(prompt, EncodeMode::kSpecials, true);
    } else {
      if (!chat->available()) fail("--input line {}: messages need the model's chat template", n);
      chat::ChatRequest chat_request;
      chat_request.messages = line["messages"];
      chat_request.add_generation_prompt = line.value("add_generation_prompt", true);
      if (line.contains("tools")) chat_request.tools = line["tools"];
      if (line.contains("chat_template_kwargs"))
        chat_request.variables = line["chat_template_kwargs"];
      try {
        protocol::ChatPrompt encoded = chat->encode(chat_request);
        r.prompt = std::move(encoded.encoded.ids);
        out.syntax = std::move(encoded.syntax);
      } catch (const std::exception& error) {
        fail("--input line {}: {}", n, error.what());
      }
    }
  }
  r.sampling = read_sampling(line, n);
  read_constraint(line, n, out.constraint);
  read_field(line, "max_tokens", r.max_tokens, n);
  read_field(line, "min_tokens", r.min_tokens, n);
  read_field(line, "ignore_eos", r.ignore_eos, n);
  read_field(line, "stop_token_ids", r.stop_token_ids, n);
  read_field(line, "priority", r.priority, n);
  read_field(line, "cache_retention", r.cache_retention, n);
  if (line.contains("cache_salt")) {
    std::string salt;
    read_field(line, "cache_salt", salt, n);
    r.cache_salt = XXH3_64bits(salt.data(), salt.size()) | 1;
  }
  if (line.contains("stop")) {
    if (line["stop"].is_string()) {
      out.stop_strings.push_back(line["stop"].get<std::string>());
    } else {
      read_field(line, "stop", out.stop_strings, n);
    }
  }
  return out;
}

// Per completion while it runs: its detokenizer and stop-string watcher.
using TextState = std::unique_ptr<protocol::CompletionText>;
using CompletionKey = std::pair<std::string, int>;  // request id, completion index

void show_progress(size_t done, size_t total, int64_t tokens, double seconds) {
  constexpr int kWidth = 30;
  int filled = total ? static_cast<int>(kWidth * done / total) : kWidth;
  fmt::print(stderr, "\r[{}{}] {}/{} requests, {:.1f} tokens/s",
             std::string(static_cast<size_t>(filled), '='),
             std::string(static_cast<size_t>(kWidth - filled), ' '), done, total,
             seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0);
}

// The model folder's tokenizer and chat template, where it has them.
struct TextTools {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<protocol::ChatEncoder> chat;  // with the tokenizer
};

TextTools load_text_tools(const std::string& model_dir) {
  TextTools tools;
  if (!std::filesystem::exists(std::filesystem::path(model_dir) / "tokenizer.json")) return tools;
  tools.tokenizer = Tokenizer::load(model_dir);
  // Without a template only "messages" lines fail, and they say so.
  tools.chat = std::make_unique<protocol::ChatEncoder>(model_dir, *tools.tokenizer,
                                                       protocol::PromptFormat::kAuto);
  return tools;
}

// Each constrained request's constraint (compiled once per distinct one), starting after a
// reasoning chat model's reasoning, as on the server.
void attach_constraints(std::vector<OfflineRequest>& requests, const TextTools& tools,
                        const std::vector<int32_t>& eos_tokens) {
  std::unique_ptr<protocol::OutputConstraints> constraints;
  for (OfflineRequest& offline : requests) {
    const protocol::GenerationParams& wanted = offline.constraint;
    if (!wanted.json_output && !wanted.structured.any()) continue;
    if (!tools.tokenizer) fail("--input: constrained output needs the model's tokenizer.json");
    if (!constraints)
      constraints = std::make_unique<protocol::OutputConstraints>(*tools.tokenizer, eos_tokens);
    try {
      offline.request.constraint =
          constraints->after_reasoning(constraints->of(wanted), offline.syntax);
    } catch (const protocol::ApiError& error) {
      fail("--input request \"{}\": {}", offline.request.id, error.what());
    }
  }
}

std::vector<OfflineRequest> read_requests(const std::string& path, const TextTools& tools) {
  std::ifstream input(path);
  if (!input) fail("--input: cannot open {}", path);
  std::vector<OfflineRequest> requests;
  std::string text;
  for (int n = 1; std::getline(input, text); ++n) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    requests.push_back(parse_line(text, n, tools.tokenizer.get(), tools.chat.get()));
  }
  return requests;
}

Json logprob_json(const sampling::Sample& sample) {
  Json entry = {{"token_id", sample.token}, {"logprob", sample.logprob}};
  if (!sample.top.empty()) {
    Json top = Json::array();
    for (const sampling::Logprob& alternative : sample.top)
      top.push_back({{"token_id", alternative.token}, {"logprob", alternative.logprob}});
    entry["top_logprobs"] = top;
  }
  return entry;
}

// One completion of a request as a "choices" entry.
Json choice_json(GenerationResult& result, protocol::CompletionText& text, bool has_text) {
  text.finish();
  Json choice = {
      {"index", result.index},
      {"token_ids", result.tokens},
      {"finish_reason", result.finish_reason == FinishReason::kStop ? "stop" : "length"}};
  if (has_text) choice["text"] = text.text();
  if (text.stopped()) choice["stop_reason"] = text.matched_stop();
  if (!result.logprobs.empty()) {
    Json logprobs = Json::array();
    for (const sampling::Sample& sample : result.logprobs) logprobs.push_back(logprob_json(sample));
    choice["logprobs"] = logprobs;
  }
  return choice;
}

// One line per request, its completions in index order.
void write_results(const std::string& path, const std::vector<OfflineRequest>& requests,
                   std::vector<std::vector<GenerationResult>>& results,
                   std::map<CompletionKey, TextState>& states, bool has_text) {
  std::ofstream output(path);
  if (!output) fail("--output: cannot open {}", path);
  for (size_t r = 0; r < results.size(); ++r) {
    std::vector<GenerationResult>& completions = results[r];
    std::sort(completions.begin(), completions.end(),
              [](const auto& a, const auto& b) { return a.index < b.index; });
    Json choices = Json::array();
    int64_t generated = 0;
    for (GenerationResult& result : completions) {
      choices.push_back(choice_json(result, *states[{result.id, result.index}], has_text));
      generated += static_cast<int64_t>(result.tokens.size());
    }
    const GenerationResult& first = completions.front();
    Json line = {{"id", first.id},
                 {"choices", choices},
                 {"usage",
                  {{"prompt_tokens", first.prompt_tokens},
                   {"completion_tokens", generated},
                   {"cached_tokens", first.cached_prompt_tokens}}}};
    if (requests[r].request.sampling.prompt_logprobs >= 0) {
      Json prompt = Json::array({nullptr});  // the first prompt token has no logprob
      for (const sampling::Sample& sample : first.prompt_logprobs)
        prompt.push_back(logprob_json(sample));
      line["prompt_logprobs"] = prompt;
    }
    output << json_text(line) << "\n";
  }
  if (!output) fail("--output: write to {} failed", path);
}

// Feeds one step's sampled tokens through each completion's detokenizer and stop strings.
void follow_text(Engine& engine, const std::vector<TokenEvent>& sampled,
                 std::map<CompletionKey, TextState>& states) {
  for (const TokenEvent& token : sampled) {
    protocol::CompletionText& text = *states[{token.id, token.index}];
    if (text.stopped()) continue;
    text.push(token.token);
    if (text.stopped()) engine.stop(token.id, token.index);
  }
}

}  // namespace

void run_offline_batch(CausalLM& model, const std::string& model_dir, const BatchOptions& options) {
  TextTools tools = load_text_tools(model_dir);
  std::vector<OfflineRequest> requests = read_requests(options.input, tools);
  attach_constraints(requests, tools, model.config().eos_token_ids);
  EngineConfig config = options.engine;
  if (tools.tokenizer)
    config.vocab_limit = std::min(model.config().vocab_size, tools.tokenizer->vocab_size());
  Engine engine(model, config);
  std::map<std::string, size_t> index;
  std::map<CompletionKey, TextState> states;
  size_t completions = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& request = requests[i].request;
    if (index.count(request.id)) fail("--input: request id \"{}\" appears twice", request.id);
    index[request.id] = i;
    engine.submit(request);
    for (int c = 0; c < request.sampling.n; ++c) {
      states[{request.id, c}] = std::make_unique<protocol::CompletionText>(
          tools.tokenizer.get(), requests[i].stop_strings);
    }
    completions += static_cast<size_t>(request.sampling.n);
  }
  std::vector<std::vector<GenerationResult>> results(requests.size());
  std::vector<GenerationResult> finished;
  std::vector<TokenEvent> sampled;
  bool tty = isatty(STDERR_FILENO) != 0;
  size_t done = 0;
  auto start = std::chrono::steady_clock::now();
  while (engine.step(finished, &sampled)) {
    follow_text(engine, sampled, states);
    sampled.clear();
    for (GenerationResult& result : finished) {
      results[index[result.id]].push_back(std::move(result));
      ++done;
    }
    finished.clear();
    if (tty) {
      double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      show_progress(done, completions, engine.stats().generated_tokens, seconds);
    }
  }
  if (tty) fmt::print(stderr, "\n");
  write_results(options.output, requests, results, states, tools.tokenizer != nullptr);
}

}  // namespace deepinfer::cli

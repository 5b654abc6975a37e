// bench-engine: the serving engine's offline throughput at several concurrencies, and
// time-to-first-token with and without prefix caching when requests share a long prefix.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "kv/block_file.h"
#include "kv/disk_tier.h"
#include "protocol/openai.h"
#include "protocol/output_constraints.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct EngineBenchArgs {
  ModelOptions model;
  std::string concurrency = "1,8,32";
  // Requests per concurrency run; 0: as many as the concurrency. More keep the batch full as
  // requests finish (a steady state, as vLLM's --num-prompts with --max-concurrency).
  int num_prompts = 0;
  int prompt_tokens = 128;
  int output_tokens = 64;
  int shared_prefix_tokens = 0;
  int unique_tokens = 100;
  int prefix_requests = 3;
  // Prompts as vLLM's custom benchmark dataset: JSONL lines with a "prompt" text; requests take
  // them in turn instead of synthetic ids.
  std::string dataset_path;
  std::vector<std::vector<int32_t>> dataset;
  // vLLM's structured_outputs object ({"json": ...}, {"regex": ...}, {"grammar": ...},
  // {"choice": [...]}) that every throughput request's output follows.
  std::string structured_outputs;
  std::shared_ptr<const structured::Constraint> constraint;
  EngineConfig engine = cli_engine_config();
  bool json = false;
};

// One dataset line's prompt: its "prompt_token_ids" as they are, or its "prompt" text tokenized
// (the tokenizer loaded on first use: a checkpoint without one can still take ids).
std::vector<int32_t> dataset_prompt(const nlohmann::json& line, const std::string& where,
                                    const std::string& model_dir, int32_t vocab,
                                    std::unique_ptr<Tokenizer>& tokenizer) {
  if (line.is_object() && line.contains("prompt_token_ids")) {
    const nlohmann::json& ids = line["prompt_token_ids"];
    if (!ids.is_array() || ids.empty())
      fail("--dataset-path: {}: \"prompt_token_ids\" is not a non-empty array", where);
    std::vector<int32_t> prompt;
    for (const nlohmann::json& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab)
        fail("--dataset-path: {}: token id {} is outside the vocabulary (size {})", where,
             id.dump(), vocab);
      prompt.push_back(id.get<int32_t>());
    }
    return prompt;
  }
  if (!line.is_object() || !line.contains("prompt") || !line["prompt"].is_string())
    fail("--dataset-path: {} is not a JSON object with a \"prompt\" string or "
         "\"prompt_token_ids\"",
         where);
  if (!tokenizer) tokenizer = Tokenizer::load(model_dir);
  std::vector<int32_t> prompt = tokenizer->encode(line["prompt"].get<std::string>());
  if (prompt.empty()) fail("--dataset-path: {} has an empty prompt", where);
  return prompt;
}

std::vector<std::vector<int32_t>> load_dataset(const std::string& path,
                                               const std::string& model_dir, int32_t vocab) {
  std::ifstream in(path);
  if (!in) fail("--dataset-path: cannot read {}", path);
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json json = nlohmann::json::parse(line, nullptr, false);
    const std::string where = fmt::format("{} line {}", path, number);
    if (json.is_discarded()) fail("--dataset-path: {} is not JSON", where);
    prompts.push_back(dataset_prompt(json, where, model_dir, vocab, tokenizer));
  }
  if (prompts.empty()) fail("--dataset-path: {} holds no prompts", path);
  return prompts;
}

std::vector<int32_t> synthetic_tokens(int count, int seed, int32_t vocab) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < count; ++i)
    tokens.push_back(
        static_cast<int32_t>((int64_t{seed} * 7919 + int64_t{i} * 104729 + 13) % vocab));
  return tokens;
}

// The constraint --structured-outputs asks for, compiled as the server would.
std::shared_ptr<const structured::Constraint> load_constraint(const std::string& text,
                                                              const std::string& model_dir,
                                                              const CausalLM& model) {
  const nlohmann::json parsed = nlohmann::json::parse(text, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object())
    fail("--structured-outputs: not a JSON object: {}", text);
  std::unique_ptr<Tokenizer> tokenizer = Tokenizer::load(model_dir);
  protocol::OutputConstraints constraints(*tokenizer, model.config().eos_token_ids);
  protocol::GenerationParams params;
  try {
    protocol::read_structured_output(nlohmann::json{{"structured_outputs", parsed}}, params);
    if (!params.structured.any()) fail("--structured-outputs: no json, regex, grammar or choice");
    return constraints.of(params);
  } catch (const protocol::ApiError& error) {
    fail("--structured-outputs: {}", error.what());
  }
}

GenerationRequest request_of(std::string id, std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest request;
  request.id = std::move(id);
  request.prompt = std::move(prompt);
  request.max_tokens = max_tokens;
  request.ignore_eos = true;
  request.sampling.temperature = 0.0f;
  return request;
}

// N requests at once (the rest of --num-prompts waiting for a place); output tokens per second
// over the whole run.
nlohmann::json throughput(CausalLM& model, const EngineBenchArgs& args, int concurrency) {
  EngineConfig config = args.engine;
  config.max_running = concurrency;
  Engine engine(model, config);
  int32_t vocab = model.config().vocab_size;
  int64_t prompt_tokens = 0;
  const int requests = std::max(concurrency, args.num_prompts);
  for (int r = 0; r < requests; ++r) {
    std::vector<int32_t> prompt = args.dataset.empty()
                                      ? synthetic_tokens(args.prompt_tokens, r + 1, vocab)
                                      : args.dataset[static_cast<size_t>(r) % args.dataset.size()];
    prompt_tokens += static_cast<int64_t>(prompt.size());
    GenerationRequest request =
        request_of(std::to_string(r), std::move(prompt), args.output_tokens);
    request.constraint = args.constraint;
    engine.submit(std::move(request));
  }
  auto start = Clock::now();
  std::vector<GenerationResult> results = engine.run_to_completion();
  double seconds = seconds_since(start);
  int64_t output = 0;
  for (const GenerationResult& result : results)
    output += static_cast<int64_t>(result.tokens.size());
  EngineStats stats = engine.stats();
  return {{"concurrency", concurrency},
          {"requests", requests},
          {"output_tokens", output},
          {"seconds", seconds},
          {"steps", stats.steps},
          {"host_ms_per_step", 1000.0 * stats.host_seconds / static_cast<double>(stats.steps)},
          {"output_tokens_per_s", static_cast<double>(output) / seconds},
          {"drafts", stats.drafts},
          {"draft_tokens", stats.draft_tokens},
          {"accepted_draft_tokens", stats.accepted_draft_tokens},
          {"accepted_per_position", stats.accepted_per_position},
          // vLLM's mean acceptance length: tokens a verification yields, its own included.
          {"mean_acceptance_length", stats.drafts == 0
                                         ? 0.0
                                         : 1.0 + static_cast<double>(stats.accepted_draft_tokens) /
                                                     static_cast<double>(stats.drafts)},
          {"total_tokens_per_s", static_cast<double>(output + prompt_tokens) / seconds}};
}

// Where a shared prefix comes from: recomputed (no prefix caching), the memory tier, the
// host-memory tier (the pool's cached blocks forgotten before each measured request), or the
// disk tier (each measured request on a fresh engine whose memory is empty).
enum class PrefixSource { kNone, kMemory, kHost, kDisk };

const char* source_name(PrefixSource source) {
  switch (source) {
    case PrefixSource::kNone:
      return "absent";
    case PrefixSource::kMemory:
      return "memory";
    case PrefixSource::kHost:
      return "host";
    case PrefixSource::kDisk:
      return "disk";
  }
  return "?";
}

// Requests that share a long prefix, one after another; mean time to their first token
// (the first request, which fills the cache, is not counted).
nlohmann::json shared_prefix_ttft(CausalLM& model, const EngineBenchArgs& args,
                                  PrefixSource source) {
  EngineConfig config = args.engine;
  config.prefix_caching = source != PrefixSource::kNone;
  if (source != PrefixSource::kDisk) config.kv_cache_dir.clear();
  if (source != PrefixSource::kHost) config.kv_host_bytes = 0;
  auto engine = std::make_unique<Engine>(model, config);
  int32_t vocab = model.config().vocab_size;
  std::vector<int32_t> prefix = synthetic_tokens(args.shared_prefix_tokens, 99, vocab);
  std::vector<double> ttft;
  int64_t cached_tokens = 0;
  for (int r = 0; r <= args.prefix_requests; ++r) {
    // The previous engine's end writes what it queued.
    if (source == PrefixSource::kDisk && r > 0) {
      engine.reset();
      engine = std::make_unique<Engine>(model, config);
    }
    if (source == PrefixSource::kHost && r > 0) engine->reset_prefix_cache();
    std::vector<int32_t> prompt = prefix;
    std::vector<int32_t> unique = synthetic_tokens(args.unique_tokens, 1000 + r, vocab);
    prompt.insert(prompt.end(), unique.begin(), unique.end());
    engine->submit(request_of("p" + std::to_string(r), prompt, 1));
    auto start = Clock::now();
    std::vector<GenerationResult> finished;
    while (finished.empty() && engine->step(finished)) {
    }
    if (r == 0) continue;
    ttft.push_back(seconds_since(start));
    if (!finished.empty()) cached_tokens += finished.front().cached_prompt_tokens;
  }
  double mean = 0.0;
  for (double value : ttft) mean += value / static_cast<double>(ttft.size());
  return {{"prefix_from", source_name(source)},
          {"mean_ttft_s", mean},
          {"requests_measured", ttft.size()},
          {"mean_cached_tokens",
           static_cast<double>(cached_tokens) / static_cast<double>(ttft.size())}};
}

// The disk tier's own throughput on --kv-cache-dir: blocks of this model's size written
// through the tier (from the first offer until all are on disk, fsync included), then read
// back and checked one after another. Uses a folder of its own, removed afterwards.
nlohmann::json disk_throughput(const CausalLM& model, const EngineBenchArgs& args) {
  DiskTierOptions options;
  options.dir = args.engine.kv_cache_dir;
  options.fingerprint = args.engine.kv_fingerprint ^ 0x6265'6e63'6800'0000ull;
  options.queue_limit = 1 << 20;
  const size_t block_bytes = model.kv_shape(args.engine.block_size).bytes_per_block();
  const int64_t blocks =
      std::clamp<int64_t>((int64_t{512} << 20) / static_cast<int64_t>(block_bytes), 16, 4096);
  std::vector<std::byte> payload(block_bytes);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 131 + 7);
  const std::vector<int32_t> tokens(static_cast<size_t>(args.engine.block_size), 1);
  double write_seconds = 0.0, read_seconds = 0.0;
  {
    DiskTier tier(options);
    auto start = Clock::now();
    for (int64_t b = 0; b < blocks; ++b) {
      if (!tier.offer(static_cast<BlockHash>(b + 1), 0, tokens, payload))
        fail("bench-engine: the disk tier's queue refused a block");
    }
    tier.flush();
    write_seconds = seconds_since(start);
    start = Clock::now();
    for (int64_t b = 0; b < blocks; ++b) {
      if (!tier.load(static_cast<BlockHash>(b + 1), 0, tokens, block_bytes))
        fail("bench-engine: block {} did not read back from {}", b, options.dir.string());
    }
    read_seconds = seconds_since(start);
  }
  std::filesystem::remove_all(
      block_file_path(options.dir, options.fingerprint, 0).parent_path().parent_path());
  const double bytes = static_cast<double>(blocks) * static_cast<double>(block_bytes);
  return {{"blocks", blocks},
          {"block_bytes", block_bytes},
          {"write_gb_per_s", bytes / write_seconds / 1e9},
          {"read_gb_per_s", bytes / read_seconds / 1e9}};
}

void run_engine_bench(const EngineBenchArgs& given) {
  LoadedModel loaded = open_model(given.model);
  CausalLM& model = *loaded.model;
  EngineBenchArgs args = given;
  if (!args.dataset_path.empty())
    args.dataset = load_dataset(args.dataset_path, args.model.model_dir, model.config().vocab_size);
  if (!args.structured_outputs.empty())
    args.constraint = load_constraint(args.structured_outputs, args.model.model_dir, model);
  prepare_kv_cache_dir(args.engine, args.model, model);
  prepare_speculative(args.engine, args.model);
  nlohmann::json report = {{"model", args.model.model_dir},
                           {"backend", loaded.ops->name()},
                           {"batch_invariant", loaded.ops->batch_invariant()},
                           {"async_scheduling", args.engine.async_scheduling},
                           {"threads", ThreadPool::global().size()},
                           {"prompt_tokens", args.prompt_tokens},
                           {"output_tokens", args.output_tokens},
                           {"structured_outputs", args.structured_outputs}};
  for (int32_t concurrency : parse_id_list(args.concurrency, "--concurrency")) {
    if (concurrency < 1) fail("--concurrency: {} is not a positive count", concurrency);
    nlohmann::json run = throughput(model, args, concurrency);
    report["throughput"].push_back(run);
    if (!args.json) {
      fmt::print(
          "concurrency {:3}: {:7.1f} output tokens/s ({} requests, {} tokens in {:.1f} s; {} "
          "steps, "
          "host work {:.3f} ms/step)\n",
          concurrency, run["output_tokens_per_s"].get<double>(), run["requests"].get<int>(),
          run["output_tokens"].get<int64_t>(), run["seconds"].get<double>(),
          run["steps"].get<int64_t>(), run["host_ms_per_step"].get<double>());
      if (args.engine.speculative.enabled()) {
        fmt::print(
            "  speculation: {} drafts verified, {} accepted; mean acceptance length {:.2f} "
            "(accepted by position: {})\n",
            run["draft_tokens"].get<int64_t>(), run["accepted_draft_tokens"].get<int64_t>(),
            run["mean_acceptance_length"].get<double>(), run["accepted_per_position"].dump());
      }
    }
  }
  if (args.shared_prefix_tokens > 0) {
    std::vector<PrefixSource> sources{PrefixSource::kNone, PrefixSource::kMemory};
    if (args.engine.kv_host_bytes > 0) sources.push_back(PrefixSource::kHost);
    if (!args.engine.kv_cache_dir.empty()) sources.push_back(PrefixSource::kDisk);
    for (PrefixSource source : sources) {
      nlohmann::json run = shared_prefix_ttft(model, args, source);
      report["shared_prefix"].push_back(run);
      if (!args.json) {
        fmt::print(
            "shared prefix {} + {} tokens, prefix from {:<6}: mean TTFT {:.3f} s ({:.0f} "
            "tokens cached)\n",
            args.shared_prefix_tokens, args.unique_tokens, source_name(source),
            run["mean_ttft_s"].get<double>(), run["mean_cached_tokens"].get<double>());
      }
    }
  }
  if (!args.engine.kv_cache_dir.empty()) {
    nlohmann::json disk = disk_throughput(model, args);
    report["disk_tier"] = disk;
    if (!args.json) {
      fmt::print(
          "disk tier: {} blocks of {} bytes: write {:.2f} GB/s (fsync each), read {:.2f} "
          "GB/s (checked)\n",
          disk["blocks"].get<int64_t>(), disk["block_bytes"].get<size_t>(),
          disk["write_gb_per_s"].get<double>(), disk["read_gb_per_s"].get<double>());
    }
  }
  if (args.json) fmt::print("{}\n", report.dump());
}

}  // namespace

void add_engine_bench_command(CLI::App& app) {
  auto args = std::make_shared<EngineBenchArgs>();
  CLI::App* command = app.add_subcommand(
      "bench-engine",
      "Measure the serving engine: throughput by concurrency, TTFT with a shared prefix");
  add_model_options(*command, args->model, "read");
  command
      ->add_option("--concurrency", args->concurrency,
                   "Concurrent requests to try, comma-separated")
      ->capture_default_str();
  command
      ->add_option("--num-prompts", args->num_prompts,
                   "Requests per concurrency run (0: as many as the concurrency); more keep the "
                   "batch full as requests finish, as a server's steady state")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command
      ->add_option("--prompt-tokens", args->prompt_tokens, "Prompt length of throughput requests")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  command
      ->add_option("--output-tokens", args->output_tokens,
                   "Tokens each throughput request generates")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  command
      ->add_option("--shared-prefix-tokens", args->shared_prefix_tokens,
                   "Also measure TTFT for requests sharing this many prompt tokens (0: skip): the "
                   "prefix absent, in memory, and with --kv-host-bytes / --kv-cache-dir in the "
                   "host-memory and disk tiers")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--unique-tokens", args->unique_tokens, "Tokens after the shared prefix")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  command
      ->add_option("--prefix-requests", args->prefix_requests,
                   "Requests measured after the one that fills the cache")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  command->add_option("--dataset-path", args->dataset_path,
                      "Throughput prompts from a JSONL file of {\"prompt\": TEXT} lines "
                      "(tokenized with the model's tokenizer) or {\"prompt_token_ids\": [...]} "
                      "lines, taken in turn (instead of --prompt-tokens synthetic ids)");
  command->add_option("--structured-outputs", args->structured_outputs,
                      "Constrain every throughput request's output as vLLM's structured_outputs "
                      "field does: a JSON object such as {\"json\": SCHEMA}, {\"regex\": "
                      "PATTERN}, {\"grammar\": GBNF_OR_LARK} or {\"choice\": [...]} (the "
                      "token masks' cost against a run without)");
  add_engine_options(*command, args->engine, "");
  command->add_flag("--json", args->json, "Print one JSON object instead of lines");
  command->callback([args] { run_engine_bench(*args); });
}

}  // namespace deepinfer::cli

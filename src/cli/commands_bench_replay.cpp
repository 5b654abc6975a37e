// bench-replay: what bounded replay of sliding-window layers costs in accuracy. For several
// prefix lengths and replay lengths, the largest logit difference against the cold prefill
// over the tokens after the prefix, and the bytes a lower tier stores per token with and
// without the windows' KV.
#include <fmt/format.h>

#include <random>

#include "cli/commands.h"
#include "core/error.h"
#include "engine/replay_error.h"

namespace deepinfer::cli {
namespace {

struct ReplayBenchArgs {
  ModelOptions model;
  std::string prefix_tokens = "128,256,512";
  std::string replay_tokens = "window,window+12,2window,exact";
  int compared_tokens = 16;
  int block_size = 16;
  uint64_t seed = 0;
};

// "window", "window+12", "2window", "exact" or a number -> tokens.
int64_t replay_length(const std::string& spec, const CausalLM::ReplayBounds& bounds) {
  if (spec == "exact") return bounds.exact;
  if (spec == "window") return bounds.window;
  if (spec == "window+12") return bounds.window + 12;
  if (spec == "2window") return 2 * bounds.window;
  int64_t tokens = parse_replay_tokens(spec);
  if (tokens <= 0) fail("--replay-tokens: '{}' is not a positive length", spec);
  return tokens;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = std::min(text.find(',', start), text.size());
    if (comma > start) items.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return items;
}

void run_replay_bench(const ReplayBenchArgs& args) {
  LoadedModel loaded = open_model(args.model);
  CausalLM& model = *loaded.model;
  const CausalLM::ReplayBounds bounds = model.replay_bounds();
  if (bounds.exact == 0)
    fail("bench-replay: {} has no sliding-window layers", args.model.model_dir);
  const int block_size = model.kv_shape(args.block_size).block_size;
  fmt::print("replay: window {}, exact replay {} tokens, block {}\n", bounds.window, bounds.exact,
             block_size);
  std::mt19937_64 random(args.seed);
  std::uniform_int_distribution<int32_t> token(0, model.config().vocab_size - 1);
  bool sizes_printed = false;
  for (int32_t prefix : parse_id_list(args.prefix_tokens, "--prefix-tokens")) {
    const int64_t restored = prefix / block_size * block_size;
    if (restored == 0) fail("--prefix-tokens: {} holds no whole block of {}", prefix, block_size);
    std::vector<int32_t> prompt(static_cast<size_t>(restored + args.compared_tokens));
    for (int32_t& id : prompt) id = token(random);
    for (const std::string& spec : split_list(args.replay_tokens)) {
      const int64_t replay = replay_length(spec, bounds);
      ReplayError error = measure_replay(model, prompt, restored, replay, block_size);
      fmt::print("replay: prefix {:>6}  R {:<10} ({:>5} tokens)  max |logit diff| {:.3e}{}\n",
                 restored, spec, error.restored_end - error.replay_start, error.max_abs_diff,
                 error.bitwise_equal ? "  (bitwise equal)" : "");
      if (!sizes_printed) {
        fmt::print("replay: stored per token: {:.0f} bytes with the windows' KV, {:.0f} without\n",
                   error.stored_bytes_per_token, error.stored_bytes_per_token_without_windows);
        sizes_printed = true;
      }
    }
  }
}

}  // namespace

void add_replay_bench_command(CLI::App& app) {
  auto args = std::make_shared<ReplayBenchArgs>();
  CLI::App* command = app.add_subcommand(
      "bench-replay",
      "Measure bounded replay of sliding-window layers: logit error against the cold prefill "
      "by prefix and replay length");
  add_model_options(*command, args->model, "mmap");
  command
      ->add_option("--prefix-tokens", args->prefix_tokens,
                   "Restored prefix lengths, comma-separated (rounded down to whole blocks)")
      ->capture_default_str();
  command
      ->add_option("--replay-tokens", args->replay_tokens,
                   "Replay lengths, comma-separated: a number, window, window+12, 2window or "
                   "exact")
      ->capture_default_str();
  command
      ->add_option("--compared-tokens", args->compared_tokens,
                   "Tokens after the prefix whose logits are compared")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  command->add_option("--block-size", args->block_size, "Tokens per KV block")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  command->add_option("--seed", args->seed, "Seed of the random prompt tokens")
      ->capture_default_str();
  command->callback([args] { run_replay_bench(*args); });
}

}  // namespace deepinfer::cli

// Sub-commands of the deepinfer CLI. Each add_* registers its flags (with --help text) and
// the action to run when it is chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace deepinfer::cli {

void add_logits_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_make_model_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_tokenizer_commands(CLI::App& app);
void add_engine_bench_command(CLI::App& app);
void add_replay_bench_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_router_command(CLI::App& app);

// Blocks SIGTERM and SIGINT (in this thread and every thread it starts after) and ignores
// SIGPIPE: call before starting a server's threads.
sigset_t block_stop_signals();
// Runs `run` until it returns; SIGTERM or SIGINT meanwhile calls `stop` once.
void run_until_signal(const sigset_t& signals, const std::function<void()>& run,
                      const std::function<void()>& stop);

// Flags every command that loads a model shares.
struct ModelOptions {
  std::string model_dir;
  std::string load = "mmap";
  std::string device = "cpu";
  std::string matmul_precision;  // empty: the backend's default (f32 on the CPU, bf16 on CUDA)
  std::string mla_cache = "latent";
  bool batch_invariant = false;
  bool enforce_eager = false;
};

// --matmul-precision as the backend applies it: "f32" or "bf16".
std::string matmul_precision(const ModelOptions& options);
void add_model_options(CLI::App& command, ModelOptions& options, const std::string& default_load);

// The engine settings serve and bench-engine start from: a 4 GiB KV budget (the library's
// default is 1 GiB).
EngineConfig cli_engine_config();

// The engine's flags (batch size, KV budget, prefix caching, overlapped scheduling); `prefix`
// starts each help text ("Offline batch: ").
void add_engine_options(CLI::App& command, EngineConfig& engine, const std::string& prefix);

// A model and the backend it runs on.
struct LoadedModel {
  std::unique_ptr<Ops> ops;
  std::unique_ptr<CausalLM> model;
};
LoadedModel open_model(const ModelOptions& options);

// --kv-cache-dir, --kv-disk-bytes, --kv-host-bytes, --kv-retention-classes, --kv-retention-default
// and
// --swa-replay-tokens; `prefix` starts each help text. Returns the options (serve names their
// DEEPINFER_* variables).
std::vector<CLI::Option*> add_kv_tier_options(CLI::App& command, EngineConfig& engine,
                                              const std::string& prefix);
// "72h" -> 259200: a whole number of s (the default unit), m, h or d; throws Error naming
// `flag`.
uint32_t parse_duration_seconds(std::string_view text, const std::string& flag);
// "agent=72h,chat=168h" -> {agent: 259200, chat: 604800}.
std::map<std::string, uint32_t> parse_retention_classes(const std::string& text);
// --speculative-config (JSON as vLLM spells it: method, model, num_speculative_tokens,
// prompt_lookup_min, prompt_lookup_max; and confidence_threshold, verification); `prefix`
// starts its help text.
CLI::Option* add_speculative_option(CLI::App& command, EngineConfig& engine,
                                    const std::string& prefix);
SpeculativeConfig parse_speculative_config(const std::string& text);
// With a draft model: its folder exists and its tokenizer, when both models have one, is the
// target's (every id the same token); a clear error otherwise.
void prepare_speculative(const EngineConfig& engine, const ModelOptions& options);
// "exact", "default" or a token count -> EngineConfig::swa_replay_tokens.
int64_t parse_replay_tokens(const std::string& text);

// With --kv-cache-dir: makes the directory (a clear error when it cannot be) and sets the
// fingerprint its blocks are filed under: the checkpoint's architecture, every tensor's name,
// dtype and shape, and the model's KV layout at the engine's block size.
void prepare_kv_cache_dir(EngineConfig& engine, const ModelOptions& options, const CausalLM& model);

// "1,2,3" -> {1, 2, 3}; throws Error naming the flag and the bad entry.
std::vector<int32_t> parse_id_list(const std::string& text, const std::string& flag);

}  // namespace deepinfer::cli

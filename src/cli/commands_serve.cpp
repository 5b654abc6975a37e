// serve: the OpenAI-compatible HTTP server, with flags named as `vllm serve` names them; each
// flag can also come from a DEEPINFER_* environment variable.
#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <thread>

#include "cli/commands.h"
#include "core/error.h"
#include "protocol/limits.h"
#include "server/api_server.h"

namespace deepinfer::cli {

sigset_t block_stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  return signals;
}

// One waiting thread takes the signal; the threads the server started inherited the mask.
void run_until_signal(const sigset_t& signals, const std::function<void()>& run,
                      const std::function<void()>& stop) {
  std::thread watcher([&] {
    int received = 0;
    sigwait(&signals, &received);
    fmt::print(stderr, "deepinfer: signal {}, finishing requests in progress\n", received);
    stop();
  });
  run();
  // run() can also end without a signal; wake the watcher so it can be joined.
  pthread_kill(watcher.native_handle(), SIGTERM);
  watcher.join();
}

namespace {

struct ServeArgs {
  ModelOptions model;
  server::ServeOptions serve;
  EngineConfig engine = cli_engine_config();
  int port = 8000;
  std::string prompt_format = "auto";
};

// SIGTERM and SIGINT ask the server to drain: new connections are refused, requests in
// progress run on for --shutdown-timeout seconds and any still running then end with a 503.
void run_serve(ServeArgs& args) {
  const sigset_t signals = block_stop_signals();
  LoadedModel loaded = open_model(args.model);
  prepare_kv_cache_dir(args.engine, args.model, *loaded.model);
  prepare_speculative(args.engine, args.model);
  args.serve.http.port = static_cast<uint16_t>(args.port);
  args.serve.prompt_format = protocol::parse_prompt_format(args.prompt_format);
  server::ApiServer api(*loaded.model, args.model.model_dir, args.engine, args.serve);
  fmt::print(stderr, "deepinfer: serving {} on http://{}:{} ({})\n", args.model.model_dir,
             args.serve.http.host, api.port(), loaded.ops->name());
  run_until_signal(
      signals, [&] { api.run(); }, [&] { api.stop(); });
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* command =
      app.add_subcommand("serve", "Serve a model over the OpenAI-compatible HTTP API");
  command->footer(protocol::request_limits_text(args->serve.http.max_body_bytes));
  add_model_options(*command, args->model, "read");
  auto option = [&](const char* flag, auto& value, const char* help, const char* env) {
    return command->add_option(flag, value, help)->envname(env)->capture_default_str();
  };
  option("--host", args->serve.http.host, "Address to listen on", "DEEPINFER_HOST");
  option("--port", args->port, "Port to listen on (0: any free port)", "DEEPINFER_PORT")
      ->check(CLI::Range(0, 65535));
  option("--api-key", args->serve.api_key,
         "Require this key on /v1 routes (Authorization: Bearer or x-api-key)",
         "DEEPINFER_API_KEY");
  option("--served-model-name", args->serve.served_model_name,
         "Model id clients use (default: the model folder's name)", "DEEPINFER_SERVED_MODEL_NAME");
  option("--max-model-len", args->serve.max_model_len,
         "Longest prompt + completion in tokens (default: the model's context length)",
         "DEEPINFER_MAX_MODEL_LEN")
      ->check(CLI::NonNegativeNumber);
  option("--max-num-seqs", args->engine.max_running, "Sequences per engine step",
         "DEEPINFER_MAX_NUM_SEQS")
      ->check(CLI::PositiveNumber);
  option("--max-num-batched-tokens", args->engine.max_batched_tokens,
         "Tokens per engine step (prefill chunks and decodes)", "DEEPINFER_MAX_NUM_BATCHED_TOKENS")
      ->check(CLI::PositiveNumber);
  option("--kv-cache-bytes", args->engine.kv_bytes,
         "KV cache budget in bytes (0: 1 GiB on the CPU, 90% of free device memory on a GPU)",
         "DEEPINFER_KV_CACHE_BYTES")
      ->check(CLI::NonNegativeNumber);
  option("--kv-cache-memory-fraction,--kv-cache-fraction", args->engine.kv_memory_fraction,
         "KV cache budget as a share of the memory available at start, device memory on a GPU "
         "(overrides bytes)",
         "DEEPINFER_KV_CACHE_MEMORY_FRACTION")
      ->check(CLI::Range(0.0, 0.99));
  option("--block-size", args->engine.block_size,
         "Tokens per KV block (DeepSeek-V4 rounds it up to a multiple of its compression rates)",
         "DEEPINFER_BLOCK_SIZE")
      ->check(CLI::Range(1, 1024));
  for (CLI::Option* tier_option : add_kv_tier_options(*command, args->engine, "")) {
    std::string variable = "DEEPINFER_" + tier_option->get_lnames().front();
    std::replace(variable.begin(), variable.end(), '-', '_');
    std::transform(variable.begin(), variable.end(), variable.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    tier_option->envname(variable);
  }
  add_speculative_option(*command, args->engine, "")->envname("DEEPINFER_SPECULATIVE_CONFIG");
  command
      ->add_flag("!--no-enable-prefix-caching", args->engine.prefix_caching,
                 "Do not reuse cached prompt prefixes")
      ->envname("DEEPINFER_NO_PREFIX_CACHING");
  command
      ->add_flag("--async-scheduling", args->engine.async_scheduling,
                 "Schedule the next engine step while the model runs this one")
      ->envname("DEEPINFER_ASYNC_SCHEDULING");
  option("--prompt-format", args->prompt_format,
         "How chat requests become prompts: auto (DeepSeek V4/V4.1 encoding when the vocabulary "
         "has its tokens, else the chat template), template, deepseek-v4 or deepseek-v4.1",
         "DEEPINFER_PROMPT_FORMAT")
      ->check(CLI::IsMember({"auto", "template", "deepseek-v4", "deepseek-v4.1"}));
  option("--max-pending-requests", args->serve.max_pending_requests,
         "Generation requests in progress at once; more get 429", "DEEPINFER_MAX_PENDING_REQUESTS")
      ->check(CLI::PositiveNumber);
  option("--shutdown-timeout", args->serve.http.drain_seconds,
         "Seconds SIGTERM lets requests in progress run; those still running then end with a "
         "503 (0: at once)",
         "DEEPINFER_SHUTDOWN_TIMEOUT")
      ->check(CLI::NonNegativeNumber);
  option("--max-request-bytes", args->serve.http.max_body_bytes,
         "Largest request body accepted; larger ones get 413", "DEEPINFER_MAX_REQUEST_BYTES")
      ->check(CLI::PositiveNumber);
  option("--http-threads", args->serve.http.io_threads,
         "Threads that accept connections, answer /health and /metrics and stream answers (any "
         "number of connections each)",
         "DEEPINFER_HTTP_THREADS")
      ->check(CLI::Range(1, 64));
  option("--request-threads", args->serve.request_threads,
         "Threads that parse, render and tokenize requests (a large prompt holds one while it "
         "is tokenized)",
         "DEEPINFER_REQUEST_THREADS")
      ->check(CLI::Range(1, 64));
  command->callback([args] { run_serve(*args); });
}

}  // namespace deepinfer::cli

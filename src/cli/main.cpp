// deepinfer: the command-line entry point.
#include <fmt/core.h>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"

int main(int argc, char** argv) {
  CLI::App app{"DeepInfer: an LLM inference engine for Hugging Face checkpoints"};
  app.require_subcommand(1);
  int threads = 0;
  app.add_option("--threads", threads, "CPU threads for kernels (default: one per hardware thread)")
      ->envname("DEEPINFER_THREADS")
      ->check(CLI::NonNegativeNumber);
  app.parse_complete_callback([&] { deepinfer::ThreadPool::set_global_threads(threads); });
  deepinfer::cli::add_logits_command(app);
  deepinfer::cli::add_generate_command(app);
  deepinfer::cli::add_make_model_command(app);
  deepinfer::cli::add_bench_command(app);
  deepinfer::cli::add_tokenizer_commands(app);
  deepinfer::cli::add_engine_bench_command(app);
  deepinfer::cli::add_replay_bench_command(app);
  deepinfer::cli::add_serve_command(app);
  deepinfer::cli::add_router_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const deepinfer::Error& error) {
    fmt::print(stderr, "error: {}\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    fmt::print(stderr, "error: {}\n", error.what());
    return 1;
  }
  return 0;
}

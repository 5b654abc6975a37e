// bench: memory bandwidth, prompt processing and decode speed on one checkpoint.
#include "cli/commands_bench.h"

#include <fmt/core.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/sequence_runner.h"
#include "kernels/cpu/isa.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace deepinfer::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Reads every byte of `tensors` once with all threads (dot(a, a) touches each cache line
// once: a pure read stream). Used both for the probe buffer and for the weights themselves,
// so the two bandwidths differ only in the memory read.
double time_read(const std::vector<const Tensor*>& tensors) {
  // All tensors cut into 256 KiB pieces and handed out from one counter in a single dispatch:
  // the best a streaming reader can do on these pages.
  constexpr int64_t kPieceFloats = int64_t{1} << 16;
  struct Piece {
    const float* data;
    int64_t count;
  };
  std::vector<Piece> pieces;
  auto add = [&](const float* data, int64_t count) {
    for (int64_t begin = 0; begin < count; begin += kPieceFloats)
      pieces.push_back({data + begin, std::min(kPieceFloats, count - begin)});
  };
  for (const Tensor* tensor : tensors) {
    add(tensor->as<const float>(), static_cast<int64_t>(tensor->nbytes() / sizeof(float)));
    if (tensor->block_scales) {
      add(tensor->block_scales->data, tensor->block_scales->rows * tensor->block_scales->cols);
    }
  }
  const cpu::IsaKernels& isa = cpu::select_kernels();
  std::atomic<float> sink{0.0f};
  auto start = Clock::now();
  ThreadPool::global().parallel_for_dynamic(
      static_cast<int64_t>(pieces.size()), 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const Piece& piece = pieces[static_cast<size_t>(i)];
          sink.store(isa.dot(piece.data, piece.data, piece.count), std::memory_order_relaxed);
        }
      });
  return seconds_since(start);
}

// Best of several read passes over a buffer far larger than the caches.
double measure_read_bandwidth(size_t bytes, int passes) {
  Buffer buffer(bytes);
  auto* values = static_cast<float*>(buffer.data());
  int64_t count = static_cast<int64_t>(bytes / sizeof(float));
  // Distinct non-zero contents: a hypervisor may back zero pages by one shared page, which
  // would make a zero-filled probe read from cache instead of memory.
  for (int64_t i = 0; i < count; ++i) values[i] = static_cast<float>(i % 1021) * 1e-3f + 1.0f;
  Tensor view = Tensor::contiguous(values, DType::kF32, {count});
  double best = 0.0;
  for (int pass = 0; pass < passes; ++pass) {
    best = std::max(best, static_cast<double>(bytes) / time_read({&view}));
  }
  return best;
}

// Peak f32 FMA rate of all threads together (independent chains, no memory traffic): the
// compute roof that prompt processing is held against.
double measure_peak_flops() {
  const cpu::IsaKernels& isa = cpu::select_kernels();
  constexpr int64_t kIterations = 20'000'000;
  std::atomic<float> sink{0.0f};
  double best = 0.0;
  for (int pass = 0; pass < 3; ++pass) {
    auto start = Clock::now();
    ThreadPool::global().run(
        [&](int, int) { sink.store(isa.fma_probe(kIterations), std::memory_order_relaxed); });
    double flops = static_cast<double>(kIterations) *
                   static_cast<double>(isa.fma_probe_flops_per_iteration) *
                   ThreadPool::global().size();
    best = std::max(best, flops / seconds_since(start));
  }
  return best;
}

// The bench result as the human-readable table.
void print_table(const nlohmann::json& r, const BenchArgs& args) {
  auto number = [&](const char* key) { return r.at(key).get<double>(); };
  double peak = number("peak_f32_fma_gflops");
  double decode = number("decode_tokens_per_s");
  double roofline = number("decode_roofline_tokens_per_s");
  double bytes_per_token = number("weight_bytes_per_token");
  double bandwidth = number("bandwidth_gbs") * 1e9;
  fmt::print("model            {}\n", args.model.model_dir);
  fmt::print("backend          {} ({} threads, weights {}, loaded in {:.2f} s)\n",
             r.at("backend").get<std::string>(), r.at("threads").get<int>(), args.model.load,
             number("load_seconds"));
  fmt::print(
      "read bandwidth   {:.2f} GB/s ({} MiB probe, best of 5); {:.2f} GB/s reading the weights "
      "between decode steps (mean; best pass {:.2f})\n",
      number("bandwidth_gbs"), args.bandwidth_mib, number("weight_read_bandwidth_gbs"),
      number("weight_read_bandwidth_best_gbs"));
  fmt::print("peak f32 FMA     {:.1f} GFLOP/s\n", peak);
  fmt::print("prompt ({} tok)  {:.1f} tokens/s, {:.1f} GFLOP/s ({:.0f}% of f32 peak; {} matmuls)\n",
             args.prompt_tokens, number("prompt_tokens_per_s"), number("prefill_gflops"),
             100.0 * number("prefill_gflops") / peak, matmul_precision(args.model));
  fmt::print(
      "decode (batch 1) {:.2f} tokens/s; roofline {:.2f} tokens/s ({:.1f} MB of weights/token): "
      "{:.0f}%\n",
      decode, roofline, bytes_per_token / 1e6, 100.0 * decode / roofline);
  fmt::print("                 against the probe's bandwidth: roofline {:.2f} tokens/s: {:.0f}%\n",
             bandwidth / bytes_per_token, 100.0 * decode * bytes_per_token / bandwidth);
  std::string cache = r.at("mla_cache").get<std::string>();
  fmt::print(
      "KV cache         {:.0f} bytes/token for the whole context + {:.0f} bytes/sequence in "
      "windows ({}f32); {:.0f} bytes/token at {} tokens\n",
      number("kv_bytes_per_token"), number("kv_window_bytes_per_sequence"),
      cache == "none" ? "" : "MLA " + cache + " cache, ",
      number("kv_bytes_at_prompt") / number("prompt_tokens"), number("prompt_tokens"));
}

void run_bench(const BenchArgs& args) {
  auto load_start = Clock::now();
  LoadedModel loaded = open_model(args.model);
  Ops* ops = loaded.ops.get();
  CausalLM* model = loaded.model.get();
  double load_seconds = seconds_since(load_start);
  if (ops->device() != Device::kCpu) {
    run_device_bench(args, loaded, load_seconds);
    return;
  }
  const ModelConfig& c = model->config();
  double bandwidth = measure_read_bandwidth(size_t(args.bandwidth_mib) << 20, 5);
  double peak_flops = measure_peak_flops();
  std::vector<int32_t> prompt(static_cast<size_t>(args.prompt_tokens));
  for (size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = static_cast<int32_t>((i * 7919 + 13) % size_t(c.vocab_size));
  // Warm-up run so first-touch page faults and thread start-up stay out of the numbers.
  {
    SequenceRunner warm(*model, 8);
    warm.feed({1, 2, 3, 4}, false);
  }
  SequenceRunner runner(*model, args.prompt_tokens + args.decode_tokens + 1);
  auto prefill_start = Clock::now();
  std::vector<float> logits = runner.feed(prompt, false);
  double prefill_seconds = seconds_since(prefill_start);
  // Decode steps alternate with a pass that only reads the same weights, so each step is
  // compared with the bandwidth of that same moment (this VM's bandwidth drifts by 2x).
  std::vector<const Tensor*> weights = model->weights_read_per_token();
  double decode_seconds = 0.0;
  double read_seconds = 0.0;
  double fastest_read = INFINITY;
  for (int i = 0; i < args.decode_tokens; ++i) {
    auto step_start = Clock::now();
    logits = runner.feed({argmax(logits.data(), c.vocab_size)}, false);
    decode_seconds += seconds_since(step_start);
    double pass_seconds = time_read(weights);
    read_seconds += pass_seconds;
    fastest_read = std::min(fastest_read, pass_seconds);
  }
  double prompt_rate = args.prompt_tokens / prefill_seconds;
  double prefill_flops = model->flops_per_token(args.prompt_tokens / 2.0) * args.prompt_tokens;
  KvCacheShape kv = model->kv_shape(16);
  // What grows with the context, and what windowed layers keep whatever its length.
  auto kv_bytes_per_token = static_cast<double>(kv.bytes_per_context_token());
  constexpr int64_t kLongContext = int64_t{1} << 30;
  double kv_window_bytes =
      kv.bytes_at_context(kLongContext) - kv_bytes_per_token * static_cast<double>(kLongContext);
  double decode_rate = args.decode_tokens / decode_seconds;
  double bytes_per_token = static_cast<double>(model->weight_bytes_per_token());
  double weight_bandwidth = bytes_per_token * args.decode_tokens / read_seconds;
  double roofline = args.decode_tokens / read_seconds;
  double best_weight_bandwidth = bytes_per_token / fastest_read;
  nlohmann::json result = {
      {"model", args.model.model_dir},
      {"backend", ops->name()},
      {"threads", ThreadPool::global().size()},
      {"load", args.model.load},
      {"load_seconds", load_seconds},
      {"bandwidth_gbs", bandwidth / 1e9},
      {"weight_read_bandwidth_gbs", weight_bandwidth / 1e9},
      {"weight_read_bandwidth_best_gbs", best_weight_bandwidth / 1e9},
      {"prompt_tokens", args.prompt_tokens},
      {"prompt_tokens_per_s", prompt_rate},
      {"prefill_gflops", prefill_flops / prefill_seconds / 1e9},
      {"peak_f32_fma_gflops", peak_flops / 1e9},
      {"matmul_precision", matmul_precision(args.model)},
      {"decode_tokens", args.decode_tokens},
      {"decode_tokens_per_s", decode_rate},
      {"weight_bytes_per_token", bytes_per_token},
      {"kv_bytes_per_token", kv_bytes_per_token},
      {"kv_window_bytes_per_sequence", kv_window_bytes},
      {"kv_bytes_at_prompt", kv.bytes_at_context(args.prompt_tokens)},
      {"mla_cache", c.is_deepseek() ? args.model.mla_cache : "none"},
      {"decode_roofline_tokens_per_s", roofline},
      {"decode_fraction_of_roofline", decode_rate / roofline},
      {"decode_fraction_of_probe_roofline", decode_rate * bytes_per_token / bandwidth}};
  if (args.json) {
    fmt::print("{}\n", result.dump());
  } else {
    print_table(result, args);
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* command =
      app.add_subcommand("bench", "Measure bandwidth, prompt and decode speed on a checkpoint");
  add_model_options(*command, args->model, "read");
  command->add_option("--prompt-tokens", args->prompt_tokens, "Prompt length for prompt processing")
      ->check(CLI::Range(1, 1 << 20));
  command->add_option("--decode-tokens", args->decode_tokens, "Tokens to decode at batch 1")
      ->check(CLI::Range(1, 1 << 20));
  command
      ->add_option("--decode-prompt-tokens", args->decode_prompt_tokens,
                   "GPU backends: the prompt batch-1 decode follows (the CPU decodes after "
                   "--prompt-tokens)")
      ->check(CLI::Range(1, 1 << 20));
  command
      ->add_option("--decode-batches", args->decode_batches,
                   "GPU backends: also time decode steps of this many sequences at once "
                   "(comma-separated), forward and device sampling without the engine")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  command
      ->add_option("--decode-batch-context", args->decode_batch_context,
                   "Cached tokens per sequence in the --decode-batches steps")
      ->check(CLI::Range(1, 1 << 20));
  command->add_option("--bandwidth-mib", args->bandwidth_mib, "Buffer size for the bandwidth probe")
      ->check(CLI::Range(64, 1 << 16));
  command->add_flag("--json", args->json, "Print one JSON object instead of a table");
  command->callback([args] { run_bench(*args); });
}

}  // namespace deepinfer::cli

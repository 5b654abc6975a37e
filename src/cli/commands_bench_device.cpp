// bench on a GPU backend: prompt processing against cuBLASLt's bf16 rate and batch-1 decode
// against the device's copy bandwidth, both measured in the same run.
#include <fmt/core.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "cli/commands_bench.h"
#include "core/error.h"
#include "engine/sequence_runner.h"
#include "sampling/sampling.h"

#ifdef DEEPINFER_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace deepinfer::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<int32_t> bench_prompt(int tokens, int64_t vocab) {
  std::vector<int32_t> prompt(static_cast<size_t>(tokens));
  for (size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(vocab));
  return prompt;
}

void print_device_table(const nlohmann::json& r) {
  auto number = [&](const char* key) { return r.at(key).get<double>(); };
  fmt::print("model            {}\n", r.at("model").get<std::string>());
  fmt::print("backend          {} (weights uploaded in {:.2f} s)\n",
             r.at("backend").get<std::string>(), number("load_seconds"));
  fmt::print("copy bandwidth   {:.2f} TB/s (device to device, read + write)\n",
             number("bandwidth_gbs") / 1e3);
  fmt::print("bf16 matmul peak {:.0f} TFLOP/s (cuBLASLt 8192^3)\n", number("peak_bf16_tflops"));
  fmt::print("prompt ({} tok) {:.0f} tokens/s, {:.0f} TFLOP/s ({:.0f}% of the bf16 peak)\n",
             r.at("prompt_tokens").get<int>(), number("prompt_tokens_per_s"),
             number("prefill_tflops"), 100.0 * number("prefill_fraction_of_peak"));
  fmt::print(
      "decode (batch 1) {:.1f} tokens/s after {} prompt tokens; roofline {:.1f} tokens/s "
      "({:.1f} MB of weights/token): {:.0f}%; {:.0f}% counting the {:.1f} MB of K/V read too\n",
      number("decode_tokens_per_s"), r.at("decode_prompt_tokens").get<int>(),
      number("decode_roofline_tokens_per_s"), number("weight_bytes_per_token") / 1e6,
      100.0 * number("decode_fraction_of_roofline"), 100.0 * number("decode_fraction_with_kv"),
      number("decode_kv_bytes_per_token") / 1e6);
}

}  // namespace

void run_device_bench(const BenchArgs& args, LoadedModel& loaded, double load_seconds) {
#ifdef DEEPINFER_WITH_CUDA
  CausalLM& model = *loaded.model;
  const ModelConfig& c = model.config();
  cuda::DeviceCeilings ceilings = cuda::measure_device_ceilings();
  std::vector<int32_t> prompt = bench_prompt(args.prompt_tokens, c.vocab_size);
  {
    // Warm-up at full size: allocator pools, cuBLASLt heuristics and lazy module loading.
    SequenceRunner warm(model, args.prompt_tokens + 1);
    warm.feed(prompt, false);
  }
  double prefill_seconds = 0;
  {
    SequenceRunner runner(model, args.prompt_tokens);
    auto prefill_start = Clock::now();
    runner.feed(prompt, false);  // returns once the logits are on the host
    prefill_seconds = seconds_since(prefill_start);
  }
  std::vector<int32_t> decode_prompt = bench_prompt(args.decode_prompt_tokens, c.vocab_size);
  SequenceRunner runner(model, args.decode_prompt_tokens + args.decode_tokens + 5);
  std::vector<float> logits = runner.feed(decode_prompt, false);
  for (int i = 0; i < 4; ++i)  // the decode shapes' first launches stay out of the timing
    logits = runner.feed({argmax(logits.data(), c.vocab_size)}, false);
  auto decode_start = Clock::now();
  for (int i = 0; i < args.decode_tokens; ++i)
    logits = runner.feed({argmax(logits.data(), c.vocab_size)}, false);
  double decode_seconds = seconds_since(decode_start);
  // K/V bytes one step reads on average, beside the weights.
  double mean_context = args.decode_prompt_tokens + 4 + args.decode_tokens / 2.0;
  double kv_bytes = mean_context * static_cast<double>(model.kv_shape(16).bytes_per_token());
  double prefill_flops = model.flops_per_token(args.prompt_tokens / 2.0) * args.prompt_tokens;
  double bytes_per_token = static_cast<double>(model.weight_bytes_per_token());
  double roofline = ceilings.copy_bytes_per_s / bytes_per_token;
  double decode_rate = args.decode_tokens / decode_seconds;
  double prefill_rate = prefill_flops / prefill_seconds;
  nlohmann::json result = {{"model", args.model.model_dir},
                           {"backend", loaded.ops->name()},
                           {"load_seconds", load_seconds},
                           {"bandwidth_gbs", ceilings.copy_bytes_per_s / 1e9},
                           {"peak_bf16_tflops", ceilings.bf16_flops_per_s / 1e12},
                           {"prompt_tokens", args.prompt_tokens},
                           {"prompt_tokens_per_s", args.prompt_tokens / prefill_seconds},
                           {"prefill_tflops", prefill_rate / 1e12},
                           {"prefill_fraction_of_peak", prefill_rate / ceilings.bf16_flops_per_s},
                           {"decode_tokens", args.decode_tokens},
                           {"decode_tokens_per_s", decode_rate},
                           {"weight_bytes_per_token", bytes_per_token},
                           {"decode_prompt_tokens", args.decode_prompt_tokens},
                           {"decode_kv_bytes_per_token", kv_bytes},
                           {"decode_roofline_tokens_per_s", roofline},
                           {"decode_fraction_of_roofline", decode_rate / roofline},
                           {"decode_fraction_with_kv", decode_rate * (bytes_per_token + kv_bytes) /
                                                           ceilings.copy_bytes_per_s}};
  if (args.json) {
    fmt::print("{}\n", result.dump());
  } else {
    print_device_table(result);
  }
#else
  (void)args;
  (void)loaded;
  (void)load_seconds;
  fail("bench: this build has no GPU backend");
#endif
}

}  // namespace deepinfer::cli

// bench on a GPU backend: prompt processing against cuBLASLt's bf16 rate and batch-1 decode
// against the device's copy bandwidth, both measured in the same run.
#include <fmt/core.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "cli/commands_bench.h"
#include "core/error.h"
#include "engine/sequence_runner.h"
#include "kv/kv_cache.h"
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
      "({:.1f} MB of weights/token): {:.0f}%; {:.0f}% counting the {:.1f} MB of K/V read too; "
      "{} of {} steps replayed a recording\n",
      number("decode_tokens_per_s"), r.at("decode_prompt_tokens").get<int>(),
      number("decode_roofline_tokens_per_s"), number("weight_bytes_per_token") / 1e6,
      100.0 * number("decode_fraction_of_roofline"), 100.0 * number("decode_fraction_with_kv"),
      number("decode_kv_bytes_per_token") / 1e6, r.at("decode_replayed_steps").get<int64_t>(),
      r.at("decode_tokens").get<int>());
}

// One decode step of `batch` sequences that each hold `context` cached tokens (their K/V
// contents do not matter for the time), with greedy draws on the device as the engine makes
// them. `issue_seconds` is the host's part: the time until forward_into returns (the ops are
// queued, not finished); `replayed` counts the timed steps that replayed a recording.
struct DecodeStepTime {
  double seconds = 0;
  double issue_seconds = 0;
  int64_t replayed = 0;
  int steps = 0;
};

DecodeStepTime time_decode_step(CausalLM& model, int batch, int context) {
  const KvCacheShape shape = model.kv_shape(16);
  const int block_size = shape.block_size;  // a model may round it up
  const KvGroupLayout groups = shape.groups();
  // Every sequence holds its whole context in full-attention groups and only its window's
  // blocks (plus the one being filled) in sliding groups.
  int64_t blocks_per_seq = (context + 1 + block_size - 1) / block_size, blocks = 1;
  for (int window : groups.group_window) {
    int64_t held = window > 0 ? (window + block_size - 1) / block_size + 1 : blocks_per_seq;
    blocks += batch * std::min(held, blocks_per_seq);
  }
  KvCache cache(shape, blocks, model.ops());
  std::vector<SequenceKv> sequences(static_cast<size_t>(batch));
  ForwardBatch step;
  for (int s = 0; s < batch; ++s) {
    SequenceKv& kv = sequences[static_cast<size_t>(s)];
    for (int64_t held = 0; held < context + 1;) {
      held = std::min<int64_t>(context + 1, held + block_size);
      kv.reserve(cache, held);
      kv.release_out_of_window(cache, held - 1);
    }
    step.add_sequence({(s * 7919 + 13) % model.config().vocab_size}, context, kv, block_size,
                      false);
  }
  BackendTensor logits(model.ops(), {batch, model.config().vocab_size});
  Tensor view = logits.view();
  std::vector<TokenDraw> draws(static_cast<size_t>(batch));
  for (int s = 0; s < batch; ++s) draws[static_cast<size_t>(s)].row = s;
  std::vector<DrawnToken> drawn(draws.size());
  DecodeStepTime time;
  auto run = [&] {
    auto issue_start = Clock::now();
    model.forward_into(step, cache, view);
    time.issue_seconds += seconds_since(issue_start);
    model.ops().sample_rows(view, draws, drawn.data());
  };
  for (int i = 0; i < 2; ++i) run();
  time = DecodeStepTime{.steps = 10};
  int64_t replays_before = model.replayed_decode_steps();
  auto start = Clock::now();
  for (int i = 0; i < time.steps; ++i) run();
  time.seconds = seconds_since(start) / time.steps;
  time.issue_seconds /= time.steps;
  time.replayed = model.replayed_decode_steps() - replays_before;
  return time;
}

nlohmann::json batched_decode(const BenchArgs& args, CausalLM& model, double copy_bytes_per_s) {
  nlohmann::json rows = nlohmann::json::array();
  double kv_per_sequence = model.kv_shape(16).bytes_at_context(args.decode_batch_context);
  for (int batch : args.decode_batches) {
    DecodeStepTime time = time_decode_step(model, batch, args.decode_batch_context);
    double step = time.seconds;
    double bytes =
        model.weight_bytes_per_step(batch) + static_cast<double>(batch) * kv_per_sequence;
    rows.push_back({{"batch", batch},
                    {"context", args.decode_batch_context},
                    {"step_ms", step * 1e3},
                    {"issue_ms", time.issue_seconds * 1e3},
                    {"replayed_steps", time.replayed},
                    {"timed_steps", time.steps},
                    {"tokens_per_s", batch / step},
                    {"bytes_per_step", bytes},
                    {"fraction_of_copy", bytes / step / copy_bytes_per_s}});
  }
  return rows;
}

void print_batched_decode(const nlohmann::json& rows) {
  for (const nlohmann::json& row : rows) {
    fmt::print(
        "decode (batch {}) {:.2f} ms/step, {:.0f} tokens/s at {} cached tokens each: {:.1f} GB "
        "of weights (the routed experts uniform routing would touch) and K/V per step, {:.0f}% "
        "of copy bandwidth; the host issues a step in "
        "{:.2f} ms, {} of {} steps replayed a recording\n",
        row.at("batch").get<int>(), row.at("step_ms").get<double>(),
        row.at("tokens_per_s").get<double>(), row.at("context").get<int>(),
        row.at("bytes_per_step").get<double>() / 1e9,
        100.0 * row.at("fraction_of_copy").get<double>(), row.at("issue_ms").get<double>(),
        row.at("replayed_steps").get<int64_t>(), row.at("timed_steps").get<int>());
  }
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
  // Greedy draws on the device, as the engine makes them: only the token comes back.
  int32_t next = argmax(logits.data(), c.vocab_size);
  for (int i = 0; i < 4; ++i)  // the decode shapes' first launches stay out of the timing
    next = runner.feed_greedy(next);
  int64_t replays_before = model.replayed_decode_steps();
  auto decode_start = Clock::now();
  for (int i = 0; i < args.decode_tokens; ++i) next = runner.feed_greedy(next);
  double decode_seconds = seconds_since(decode_start);
  int64_t decode_replays = model.replayed_decode_steps() - replays_before;
  // K/V bytes one step reads on average, beside the weights.
  double mean_context = args.decode_prompt_tokens + 4 + args.decode_tokens / 2.0;
  double kv_bytes = model.kv_shape(16).bytes_at_context(static_cast<int64_t>(mean_context));
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
                           {"decode_replayed_steps", decode_replays},
                           {"weight_bytes_per_token", bytes_per_token},
                           {"decode_prompt_tokens", args.decode_prompt_tokens},
                           {"decode_kv_bytes_per_token", kv_bytes},
                           {"decode_roofline_tokens_per_s", roofline},
                           {"decode_fraction_of_roofline", decode_rate / roofline},
                           {"decode_fraction_with_kv", decode_rate * (bytes_per_token + kv_bytes) /
                                                           ceilings.copy_bytes_per_s}};
  result["decode_batches"] = batched_decode(args, model, ceilings.copy_bytes_per_s);
  if (args.json) {
    fmt::print("{}\n", result.dump());
  } else {
    print_device_table(result);
    print_batched_decode(result.at("decode_batches"));
  }
#else
  (void)args;
  (void)loaded;
  (void)load_seconds;
  fail("bench: this build has no GPU backend");
#endif
}

}  // namespace deepinfer::cli

// logits, generate and make-model.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <charconv>
#include <random>

#include "cli/batch.h"
#include "cli/commands.h"
#include "core/error.h"
#include "engine/sequence_runner.h"
#include "kernels/ops.h"
#include "kv/block_file.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "sampling/sampling.h"

#ifdef DEEPINFER_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace deepinfer::cli {

std::vector<int32_t> parse_id_list(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string_view item(text.data() + start, comma - start);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    int32_t id = 0;
    auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), id);
    if (item.empty() || error != std::errc() || end != item.data() + item.size() || id < 0) {
      fail("{}: \"{}\" is not a token id (expected comma-separated non-negative integers)", flag,
           item);
    }
    ids.push_back(id);
    start = comma + 1;
  }
  return ids;
}

void add_model_options(CLI::App& command, ModelOptions& options, const std::string& default_load) {
  options.load = default_load;
  command.add_option("model_dir", options.model_dir, "Hugging Face model folder")
      ->required()
      ->check(CLI::ExistingDirectory);
  command
      .add_option("--load", options.load,
                  "How weights reach memory: mmap (instant, shared) or read (copied in)")
      ->check(CLI::IsMember({"mmap", "read"}))
      ->envname("DEEPINFER_LOAD")
      ->capture_default_str();
  command
      .add_option("--device", options.device,
                  "Backend: cpu, or cuda / cuda:N (weights, KV cache and activations on GPU N)")
      ->check([](const std::string& value) {
        bool cuda =
            value == "cuda" || (value.rfind("cuda:", 0) == 0 && value.size() > 5 &&
                                value.find_first_not_of("0123456789", 5) == std::string::npos);
        return value == "cpu" || cuda ? std::string() : "expected cpu, cuda or cuda:N";
      })
      ->envname("DEEPINFER_DEVICE")
      ->capture_default_str();
  command
      .add_option("--matmul-precision", options.matmul_precision,
                  "Prompt matmuls over bf16 weights: f32 activations (exact) or bf16 (AVX512-BF16 "
                  "dot products on the CPU, cuBLASLt on CUDA, where DeepSeek-V4's indexer "
                  "scores and sparse attention over prompts also run in bf16); default f32 on "
                  "the CPU, bf16 on CUDA")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->envname("DEEPINFER_MATMUL_PRECISION");
  command
      .add_option("--mla-cache", options.mla_cache,
                  "DeepSeek MLA cache: latent (kv_lora_rank + rope values per token, absorbed "
                  "decode) or expanded (per-head keys and values)")
      ->check(CLI::IsMember({"latent", "expanded"}))
      ->envname("DEEPINFER_MLA_CACHE")
      ->capture_default_str();
  command
      .add_flag("--enforce-eager", options.enforce_eager,
                "GPU backends: run decode steps op by op instead of replaying recorded CUDA "
                "graphs")
      ->envname("DEEPINFER_ENFORCE_EAGER");
  command
      .add_flag("--batch-invariant", options.batch_invariant,
                "Bitwise the same logits for a request whatever is batched with it and however "
                "its prompt is chunked (fixed summation order; see BENCHMARKS.md for its cost)")
      ->envname("DEEPINFER_BATCH_INVARIANT");
}

EngineConfig cli_engine_config() {
  EngineConfig config;
  config.kv_bytes = size_t{4} << 30;
  return config;
}

void add_engine_options(CLI::App& command, EngineConfig& engine, const std::string& prefix) {
  command
      .add_option("--max-batched-tokens", engine.max_batched_tokens,
                  prefix + "tokens per engine step (prefill chunks and decodes)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command.add_option("--max-running", engine.max_running, prefix + "sequences per step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command
      .add_option("--kv-cache-bytes", engine.kv_bytes,
                  prefix +
                      "KV cache budget in bytes (0: 1 GiB on the CPU, 90% of free device memory "
                      "on a GPU)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command
      .add_option("--kv-cache-fraction,--kv-cache-memory-fraction", engine.kv_memory_fraction,
                  prefix +
                      "KV cache budget as a share of the memory available at start, device "
                      "memory on a GPU (overrides --kv-cache-bytes)")
      ->check(CLI::Range(0.0, 0.99));
  command.add_option("--block-size", engine.block_size, prefix + "tokens per KV block")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  command.add_flag("!--no-prefix-caching", engine.prefix_caching,
                   prefix + "do not reuse cached prompt prefixes");
  command.add_flag("--async-scheduling", engine.async_scheduling,
                   prefix + "schedule the next step while the model runs this one");
  add_kv_tier_options(command, engine, prefix);
  add_speculative_option(command, engine, prefix);
}

namespace {

std::unique_ptr<Ops> make_backend(const ModelOptions& options) {
  MatmulPrecision precision =
      matmul_precision(options) == "bf16" ? MatmulPrecision::kBf16 : MatmulPrecision::kF32;
  if (options.device == "cpu") return make_cpu_ops(precision, options.batch_invariant);
  if (options.batch_invariant)
    fail(
        "--batch-invariant runs on the CPU backend only (the CUDA kernels' order depends on "
        "the batch)");
#ifdef DEEPINFER_WITH_CUDA
  int gpu = options.device == "cuda" ? 0 : std::stoi(options.device.substr(5));
  return cuda::make_cuda_ops(gpu, precision);
#else
  fail("--device {}: this build has no CUDA backend (nvcc was not found when it was configured)",
       options.device);
#endif
}

}  // namespace

std::string matmul_precision(const ModelOptions& options) {
  if (!options.matmul_precision.empty()) return options.matmul_precision;
  return options.device == "cpu" ? "f32" : "bf16";
}

LoadedModel open_model(const ModelOptions& options) {
  LoadedModel loaded;
  if (options.batch_invariant && matmul_precision(options) != "f32")
    fail("--batch-invariant needs --matmul-precision f32");
  loaded.ops = make_backend(options);
  ModelLoadOptions load;
  load.mode = options.load == "read" ? LoadMode::kRead : LoadMode::kMmap;
  load.mla_cache = options.mla_cache == "expanded" ? MlaCache::kExpanded : MlaCache::kLatent;
  load.record_decode_steps = !options.enforce_eager;
  loaded.model = load_model(options.model_dir, load, *loaded.ops);
  return loaded;
}

namespace {

// Checked before any work: ids inside the vocabulary, and the whole sequence (prompt plus
// what will be generated) inside the model's context length.
void check_ids_fit(const std::vector<int32_t>& ids, int64_t new_tokens, const ModelConfig& config,
                   const char* flag) {
  for (int32_t id : ids) {
    if (id >= config.vocab_size)
      fail("{}: token id {} is outside the vocabulary (size {})", flag, id, config.vocab_size);
  }
  int64_t total = static_cast<int64_t>(ids.size()) + new_tokens;
  if (total > config.max_position_embeddings) {
    fail("{}: {} prompt tokens + {} new tokens exceed the model's context length of {}", flag,
         ids.size(), new_tokens, config.max_position_embeddings);
  }
}

struct LogitsArgs {
  ModelOptions model;
  std::string ids, out;
};

void run_logits(const LogitsArgs& args) {
  LoadedModel loaded = open_model(args.model);
  CausalLM* model = loaded.model.get();
  std::vector<int32_t> ids = parse_id_list(args.ids, "--ids");
  check_ids_fit(ids, 0, model->config(), "--ids");
  SequenceRunner runner(*model, static_cast<int64_t>(ids.size()));
  std::vector<float> logits = runner.feed(ids, true);
  auto rows = static_cast<int64_t>(ids.size());
  Tensor view = Tensor::contiguous(logits.data(), DType::kF32, {rows, model->config().vocab_size});
  write_safetensors(args.out, {{"logits", view}});
}

struct GenerateArgs {
  ModelOptions model;
  BatchOptions batch;
  std::string prompt_ids, output = "ids";
  int max_tokens = 16;
  bool ignore_eos = false;
  sampling::SamplingParams sampling = greedy_sampling();
  int64_t seed = -1;

  static sampling::SamplingParams greedy_sampling() {
    sampling::SamplingParams params;
    params.temperature = 0.0f;
    return params;
  }
};

// One prompt through the engine, for what only the engine does (speculative decoding).
std::vector<int32_t> generate_with_engine(CausalLM& model, const std::vector<int32_t>& prompt,
                                          const GenerateArgs& args) {
  GenerationRequest request;
  request.id = "generate";
  request.prompt = prompt;
  request.max_tokens = args.max_tokens;
  request.ignore_eos = args.ignore_eos;
  request.sampling = args.sampling;
  if (args.seed >= 0) request.sampling.seed = static_cast<uint64_t>(args.seed);
  Engine engine(model, args.batch.engine);
  engine.submit(std::move(request));
  return engine.run_to_completion().at(0).tokens;
}

void run_generate(const GenerateArgs& args) {
  bool offline = !args.batch.input.empty();
  if (offline == !args.prompt_ids.empty())
    fail("generate: give either --prompt-ids or --input (with --output)");
  if (offline && args.output == "ids") fail("generate: --input needs --output RESULTS.jsonl");
  if (!offline && args.output != "ids")
    fail("generate: --output {} is only for --input batches (single prompts print ids)",
         args.output);
  LoadedModel loaded = open_model(args.model);
  CausalLM* model = loaded.model.get();
  if (offline) {
    BatchOptions batch = args.batch;
    batch.output = args.output;
    prepare_kv_cache_dir(batch.engine, args.model, *model);
    prepare_speculative(batch.engine, args.model);
    run_offline_batch(*model, args.model.model_dir, batch);
    return;
  }
  std::vector<int32_t> prompt = parse_id_list(args.prompt_ids, "--prompt-ids");
  check_ids_fit(prompt, args.max_tokens, model->config(), "--prompt-ids");
  if (args.batch.engine.speculative.enabled()) {
    prepare_speculative(args.batch.engine, args.model);
    fmt::print("{}\n", fmt::join(generate_with_engine(*model, prompt, args), " "));
    return;
  }
  GenerateOptions options;
  options.max_new_tokens = args.max_tokens;
  options.stop_at_eos = !args.ignore_eos;
  options.sampling = args.sampling;
  if (args.seed >= 0) {
    options.sampling.seed = static_cast<uint64_t>(args.seed);
  } else {
    options.seed = std::random_device{}() * uint64_t{0x100000001} ^ std::random_device{}();
  }
  std::vector<int32_t> generated = generate(*model, prompt, options);
  fmt::print("{}\n", fmt::join(generated, " "));
}

}  // namespace

void add_logits_command(CLI::App& app) {
  auto args = std::make_shared<LogitsArgs>();
  CLI::App* command =
      app.add_subcommand("logits", "Write the logits at every position of a prompt");
  add_model_options(*command, args->model, "mmap");
  command->add_option("--ids", args->ids, "Prompt token ids, comma-separated (e.g. 1,2,3)")
      ->required();
  command
      ->add_option("--out", args->out,
                   "Output .safetensors file: one float32 tensor \"logits\" [T, vocab]")
      ->required();
  command->callback([args] { run_logits(*args); });
}

void add_generate_command(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* command =
      app.add_subcommand("generate", "Continue a prompt and print the generated token ids");
  add_model_options(*command, args->model, "mmap");
  command->add_option("--prompt-ids", args->prompt_ids, "Prompt token ids, comma-separated");
  command
      ->add_option("--input", args->batch.input,
                   "Offline batch: JSONL requests (prompt, messages or prompt_token_ids, plus "
                   "sampling parameters)")
      ->check(CLI::ExistingFile);
  add_engine_options(*command, args->batch.engine, "Offline batch: ");
  command->add_option("--max-tokens", args->max_tokens, "Most tokens to generate")
      ->check(CLI::Range(1, 1 << 20));
  sampling::SamplingParams& p = args->sampling;
  command->add_option("--temperature", p.temperature, "Sampling temperature; 0 is greedy")
      ->capture_default_str();
  command->add_option("--top-k", p.top_k, "Keep the k most likely tokens (0: all)");
  command->add_option("--top-p", p.top_p, "Keep the most likely tokens up to this probability");
  command->add_option("--min-p", p.min_p, "Drop tokens below this fraction of the top one's");
  command->add_option("--repetition-penalty", p.repetition_penalty,
                      "Divide (or multiply, if negative) the logits of seen tokens");
  command->add_option("--presence-penalty", p.presence_penalty,
                      "Subtract from the logits of tokens already generated");
  command->add_option("--frequency-penalty", p.frequency_penalty,
                      "Subtract this times each generated token's count");
  command
      ->add_option("--seed", args->seed,
                   "Seed: the same seed gives the same tokens (default random)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--output", args->output,
                      "Single prompt: what to print (ids, the default); with --input: the JSONL "
                      "file to write results to, in input order");
  command->add_flag("--ignore-eos", args->ignore_eos,
                    "Keep generating past end-of-sequence tokens");
  command->callback([args] { run_generate(*args); });
}

// make-model's integer options of one help group, positive or non-negative.
struct GroupedOptions {
  CLI::App& command;
  const char* group;
  void positive(const char* flag, int& value, const char* help) const {
    command.add_option(flag, value, help)->check(CLI::PositiveNumber)->group(group);
  }
  void non_negative(const char* flag, int& value, const char* help) const {
    command.add_option(flag, value, help)->check(CLI::NonNegativeNumber)->group(group);
  }
};

// The MLA / MoE / MTP shape of deepseek_v2 and deepseek_v3 checkpoints.
void add_deepseek_make_options(CLI::App& command, MakeModelOptions& o) {
  GroupedOptions options{command, "DeepSeek"};
  options.non_negative("--q-lora-rank", o.q_lora_rank, "Query LoRA rank; 0 for a plain q_proj");
  options.positive("--kv-lora-rank", o.kv_lora_rank, "Latent KV rank (kv_lora_rank)");
  options.positive("--qk-nope-dim", o.qk_nope_head_dim, "Per-head query/key size without rope");
  options.positive("--qk-rope-dim", o.qk_rope_head_dim, "Per-head rope size (decoupled key)");
  options.positive("--v-head-dim", o.v_head_dim, "Per-head value size");
  options.positive("--experts", o.num_experts, "Routed experts per MoE layer");
  options.non_negative("--shared-experts", o.num_shared_experts, "Shared experts per MoE layer");
  options.positive("--experts-per-token", o.experts_per_token, "Routed experts each token uses");
  options.positive("--moe-intermediate", o.moe_intermediate_size,
                   "Intermediate size of one expert");
  options.non_negative("--dense-layers", o.first_dense_layers,
                       "Leading layers with a dense MLP (first_k_dense_replace)");
  options.positive("--expert-groups", o.expert_groups, "Expert groups (n_group)");
  options.positive("--topk-groups", o.topk_groups, "Groups each token may use (topk_group)");
  options.non_negative("--mtp-layers", o.num_mtp_layers,
                       "Multi-token-prediction modules (num_nextn_predict_layers)");
}

// DeepSeek-V4's own fields (with --q-lora-rank, --qk-rope-dim, --head-dim, --sliding-window
// and the expert options).
void add_deepseek_v4_make_options(CLI::App& command, MakeModelOptions& o) {
  GroupedOptions options{command, "DeepSeek-V4"};
  options.positive("--o-groups", o.o_groups, "Groups of the output projection (o_groups)");
  options.positive("--o-lora-rank", o.o_lora_rank, "Per-group output rank (o_lora_rank)");
  options.positive("--index-heads", o.index_heads, "Lightning-indexer heads (index_n_heads)");
  options.positive("--index-head-dim", o.index_head_dim, "Lightning-indexer head size");
  options.positive("--index-topk", o.index_topk,
                   "Compressed entries each query keeps (index_topk)");
  options.positive("--hc-mult", o.hc_mult, "Residual streams of the hyper-connections (hc_mult)");
  options.non_negative("--hash-layers", o.num_hash_layers, "Leading hash-routed MoE layers");
  command
      .add_option("--compress-ratios", o.compress_ratios,
                  "Per layer 0 (window only), 4 (CSA) or 128 (HCA), comma-separated "
                  "(default: transformers' schedule)")
      ->delimiter(',')
      ->group("DeepSeek-V4");
}

void add_make_model_command(CLI::App& app) {
  auto options = std::make_shared<MakeModelOptions>();
  auto out = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("bf16");
  CLI::App* command = app.add_subcommand(
      "make-model", "Write a random-weight checkpoint in the Hugging Face layout");
  command->add_option("out_dir", *out, "Folder to write (created if missing)")->required();
  command->add_option("--family", options->family, "Architecture family")
      ->check(CLI::IsMember(
          {"llama", "mistral", "qwen2", "qwen3", "deepseek_v2", "deepseek_v3", "deepseek_v4"}));
  command->add_option("--vocab", options->vocab_size, "Vocabulary size")
      ->check(CLI::PositiveNumber);
  command->add_option("--hidden", options->hidden_size, "Hidden size")->check(CLI::PositiveNumber);
  command->add_option("--intermediate", options->intermediate_size, "MLP intermediate size")
      ->check(CLI::PositiveNumber);
  command->add_option("--layers", options->num_layers, "Number of layers")
      ->check(CLI::PositiveNumber);
  command->add_option("--heads", options->num_heads, "Attention heads")->check(CLI::PositiveNumber);
  command
      ->add_option("--kv-heads", options->num_kv_heads,
                   "Key/value heads (GQA when fewer than --heads)")
      ->check(CLI::PositiveNumber);
  command->add_option("--head-dim", options->head_dim, "Head size (default hidden / heads)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--max-position", options->max_position_embeddings, "max_position_embeddings")
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--sliding-window", options->sliding_window,
                   "Sliding window (mistral, qwen2, qwen3); 0 for none")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--rope-theta", options->rope_theta, "Rope base")->check(CLI::PositiveNumber);
  command->add_option("--rope-scaling", options->rope_scaling_json,
                      "rope_scaling as JSON, e.g. '{\"rope_type\":\"llama3\",...}'");
  command->add_flag("--tie-embeddings", options->tie_word_embeddings,
                    "Share the embedding table with the LM head");
  command
      ->add_option("--dtype", *dtype,
                   "Weight dtype; fp8 (deepseek only) stores projections as e4m3 with 128x128 "
                   "block scales and the rest as bf16")
      ->check(CLI::IsMember({"bf16", "f16", "f32", "fp8"}));
  add_deepseek_make_options(*command, *options);
  add_deepseek_v4_make_options(*command, *options);
  command->add_option("--seed", options->seed, "Seed for the random weights");
  auto shard_mib = std::make_shared<size_t>(5 << 10);
  command
      ->add_option("--max-shard-mib", *shard_mib,
                   "Largest shard in MiB; bigger models get an index")
      ->check(CLI::PositiveNumber);
  command->callback([options, out, dtype, shard_mib] {
    options->max_shard_bytes = *shard_mib << 20;
    options->dtype = *dtype == "bf16"  ? DType::kBF16
                     : *dtype == "f16" ? DType::kF16
                     : *dtype == "fp8" ? DType::kF8E4M3
                                       : DType::kF32;
    make_random_model(*options, *out);
    fmt::print("wrote {}\n", *out);
  });
}

}  // namespace deepinfer::cli

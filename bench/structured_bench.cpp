// Cost of one json_object token mask over a real vocabulary (Qwen3's 151k tokens), per
// grammar state: the mask is computed on the sampling path of every constrained decode step.
#include <benchmark/benchmark.h>

#include "structured/structured.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

struct Vocabulary {
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<const structured::Constraint> constraint;
};

const Vocabulary& qwen3() {
  static const Vocabulary vocabulary = [] {
    Vocabulary v;
    v.tokenizer = Tokenizer::load(std::string(DEEPINFER_TOKENIZERS) + "/qwen3");
    std::vector<int32_t> control;
    for (int32_t id = 0; id < v.tokenizer->vocab_size(); ++id)
      if (v.tokenizer->is_special(id)) control.push_back(id);
    auto table = std::make_shared<structured::TokenTable>(
        v.tokenizer->token_bytes(), std::vector<int32_t>{*v.tokenizer->token_to_id("<|im_end|>")},
        control);
    v.constraint = structured::json_object_constraint(table);
    return v;
  }();
  return vocabulary;
}

// The mask after `prefix` (fed token by token as the tokenizer splits it).
void BM_JsonMask(benchmark::State& state, const char* prefix) {
  const Vocabulary& v = qwen3();
  auto matcher = v.constraint->start();
  for (int32_t id : v.tokenizer->encode(prefix, EncodeMode::kPlain))
    if (!matcher->accept(id)) state.SkipWithError("prefix is not JSON");
  std::vector<float> logits(static_cast<size_t>(v.tokenizer->vocab_size()));
  for (auto _ : state) {
    matcher->mask_logits(logits.data(), static_cast<int32_t>(logits.size()));
    benchmark::DoNotOptimize(logits.data());
  }
}

BENCHMARK_CAPTURE(BM_JsonMask, start, "")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_JsonMask, key, R"({")")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_JsonMask, in_string_value, R"({"name": "a)")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_JsonMask, after_value, R"({"a": [1, 2)")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace deepinfer

BENCHMARK_MAIN();

// Encode throughput (Google Benchmark): one thread encoding the mixed tokenizer corpus (prose,
// code, CJK, RTL, emoji, odd whitespace, control-token look-alikes), in MiB/s of UTF-8 input.
// Tokenizer files come from the build's tokenizers/ folder (scripts/fetch_tokenizers.sh).
#include <benchmark/benchmark.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = [] {
    std::ifstream stream(DEEPINFER_CORPUS);
    return nlohmann::json::parse(stream).get<std::vector<std::string>>();
  }();
  return texts;
}

// `cold` clears the word cache before every pass, so nothing carries over between passes
// over the corpus (words repeating inside a pass still hit).
void BM_Encode(benchmark::State& state, const char* family, EncodeMode mode, bool cold) {
  auto tokenizer = Tokenizer::load(std::string(DEEPINFER_TOKENIZERS) + "/" + family);
  int64_t bytes = 0;
  for (const std::string& text : corpus()) bytes += static_cast<int64_t>(text.size());
  int64_t tokens = 0;
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      tokenizer->clear_cache();
      state.ResumeTiming();
    }
    for (const std::string& text : corpus()) {
      std::vector<int32_t> ids = tokenizer->encode(text, mode);
      tokens += static_cast<int64_t>(ids.size());
      benchmark::DoNotOptimize(ids.data());
    }
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(BM_Encode, deepseek_v3, "deepseek_v3", EncodeMode::kSpecials, false)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, qwen3, "qwen3", EncodeMode::kSpecials, false)->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, llama3, "llama3", EncodeMode::kSpecials, false)->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, gemma3, "gemma3", EncodeMode::kSpecials, false)->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, llama3_plain, "llama3", EncodeMode::kPlain, false)->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, deepseek_v3_cold, "deepseek_v3", EncodeMode::kSpecials, true)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, qwen3_cold, "qwen3", EncodeMode::kSpecials, true)->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, llama3_cold, "llama3", EncodeMode::kSpecials, true)->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, gemma3_cold, "gemma3", EncodeMode::kSpecials, true)->UseRealTime();

}  // namespace
}  // namespace deepinfer

BENCHMARK_MAIN();

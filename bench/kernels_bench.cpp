// Kernel micro-benchmarks (Google Benchmark): decode-shaped matmuls against the plain read
// bandwidth of the same memory, and prefill-shaped matmuls in GFLOP/s.
#include <benchmark/benchmark.h>

#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/isa.h"
#include "kernels/ops.h"

namespace deepinfer {
namespace {

// Enough distinct weight matrices that every iteration streams from DRAM, not cache.
constexpr int64_t kRows = 8192;
constexpr int64_t kDepth = 2048;
constexpr int kMatrices = 24;

struct DecodeWeights {
  DecodeWeights() : buffer(static_cast<size_t>(kMatrices * kRows * kDepth) * 2) {
    auto* values = static_cast<uint16_t*>(buffer.data());
    for (int64_t i = 0; i < kMatrices * kRows * kDepth; ++i)
      values[i] = static_cast<uint16_t>(0x3c00 + (i & 0xff));
  }
  Tensor matrix(int index) const {
    return Tensor::contiguous(static_cast<uint16_t*>(buffer.data()) + index * kRows * kDepth,
                              DType::kBF16, {kRows, kDepth});
  }
  Buffer buffer;
};

const DecodeWeights& decode_weights() {
  static DecodeWeights weights;
  return weights;
}

void BM_ReadBandwidth(benchmark::State& state) {
  const DecodeWeights& weights = decode_weights();
  const cpu::IsaKernels& isa = cpu::select_kernels();
  auto* floats = static_cast<const float*>(weights.buffer.data());
  int64_t count = static_cast<int64_t>(weights.buffer.size() / sizeof(float));
  float sink = 0;
  for (auto _ : state) {
    ThreadPool::global().parallel_for(count, 1 << 16, [&](int64_t begin, int64_t end) {
      benchmark::DoNotOptimize(isa.dot(floats + begin, floats + begin, end - begin));
    });
  }
  benchmark::DoNotOptimize(sink);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(weights.buffer.size()));
}
BENCHMARK(BM_ReadBandwidth)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MatmulDecodeBf16(benchmark::State& state) {
  const DecodeWeights& weights = decode_weights();
  auto ops = make_cpu_ops();
  FloatTensor x({1, kDepth});
  FloatTensor y({1, kRows});
  for (int64_t i = 0; i < kDepth; ++i) x.data()[i] = 0.01f * static_cast<float>(i % 7);
  Tensor y_view = y.view();
  int next = 0;
  for (auto _ : state) {
    ops->matmul(x.view(), weights.matrix(next), nullptr, y_view);
    next = (next + 1) % kMatrices;
  }
  state.SetBytesProcessed(state.iterations() * kRows * kDepth * 2);
}
BENCHMARK(BM_MatmulDecodeBf16)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The same bytes read as FP8 e4m3 [kRows, 2 * kDepth] with 128 x 128 block scales: one
// decode matmul streams as many bytes as the bf16 case, so the two rates compare directly.
void BM_MatmulDecodeFp8(benchmark::State& state) {
  const DecodeWeights& weights = decode_weights();
  auto ops = make_cpu_ops();
  constexpr int64_t kFp8Depth = 2 * kDepth;
  std::vector<float> scale_data(static_cast<size_t>(kRows / 128 * kFp8Depth / 128), 1e-3f);
  BlockScales scales{scale_data.data(), kRows / 128, kFp8Depth / 128, 128, 128};
  FloatTensor x({1, kFp8Depth});
  FloatTensor y({1, kRows});
  for (int64_t i = 0; i < kFp8Depth; ++i) x.data()[i] = 0.01f * static_cast<float>(i % 7);
  Tensor y_view = y.view();
  int next = 0;
  for (auto _ : state) {
    Tensor matrix = weights.matrix(next);
    matrix.dtype = DType::kF8E4M3;
    matrix.shape[1] = kFp8Depth;
    matrix.strides[0] = kFp8Depth;
    matrix.block_scales = &scales;
    ops->matmul(x.view(), matrix, nullptr, y_view);
    next = (next + 1) % kMatrices;
  }
  state.SetBytesProcessed(state.iterations() * kRows * kFp8Depth);
}
BENCHMARK(BM_MatmulDecodeFp8)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_MatmulPrefillBf16(benchmark::State& state) {
  const DecodeWeights& weights = decode_weights();
  auto ops = make_cpu_ops(state.range(1) ? MatmulPrecision::kBf16 : MatmulPrecision::kF32);
  int64_t tokens = state.range(0);
  FloatTensor x({tokens, kDepth});
  FloatTensor y({tokens, kRows});
  for (int64_t i = 0; i < tokens * kDepth; ++i) x.data()[i] = 0.01f * static_cast<float>(i % 7);
  Tensor y_view = y.view();
  for (auto _ : state) ops->matmul(x.view(), weights.matrix(0), nullptr, y_view);
  state.counters["GFLOP/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2.0 * tokens * kRows * kDepth / 1e9,
      benchmark::Counter::kIsRate);
}
// Second argument: 0 = f32 activations, 1 = bf16 activations with bf16 dot products.
BENCHMARK(BM_MatmulPrefillBf16)
    ->ArgNames({"tokens", "bf16_activations"})
    ->Args({64, 0})
    ->Args({512, 0})
    ->Args({64, 1})
    ->Args({512, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// One host draw (the CPU backend's sample_rows, and the host path of every backend) over a
// Llama-3-sized vocabulary of peaked logits: 200 likely tokens over a flat N(0, 1) tail.
// Arguments: temperature x 10 (0: greedy), top_k, top_p x 100.
void BM_Draw(benchmark::State& state) {
  const int64_t vocab = 128256;
  std::vector<float> logits(static_cast<size_t>(vocab));
  uint64_t bits = 12345;
  for (float& logit : logits) {  // a uniform sum of four: close enough to normal here
    float sum = 0.0f;
    for (int i = 0; i < 4; ++i) {
      bits = bits * 6364136223846793005ull + 1442695040888963407ull;
      sum += static_cast<float>(bits >> 40) / static_cast<float>(1 << 24) - 0.5f;
    }
    logit = sum * 1.7f;
  }
  for (int64_t i = 0; i < 200; ++i) logits[static_cast<size_t>(i * 601)] += 12.0f;
  TokenDraw draw;
  draw.temperature = static_cast<float>(state.range(0)) / 10.0f;
  draw.top_k = static_cast<int32_t>(state.range(1));
  draw.top_p = static_cast<float>(state.range(2)) / 100.0f;
  draw.with_logprob = false;
  int64_t draws = 0;
  for (auto _ : state) {
    draw.uniform = static_cast<double>(draws++ % 97) / 97.0;
    benchmark::DoNotOptimize(draw_token(logits.data(), vocab, draw));
  }
}
BENCHMARK(BM_Draw)
    ->ArgNames({"temperature_x10", "top_k", "top_p_x100"})
    ->Args({0, 0, 100})
    ->Args({8, 0, 100})
    ->Args({8, 50, 100})
    ->Args({8, 0, 90})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace deepinfer

BENCHMARK_MAIN();

// The H200's ceilings as our code meets them: device-to-device copy bandwidth, the decode
// product over Llama-3.1-8B's weight shapes (one token, bf16 weights) against that bandwidth,
// and cuBLASLt's bf16 rate on a large product. Median of 20 timed runs after warm-up, timed
// with CUDA events, on random data; inputs rotate so L2 (60 MB) cannot hold them.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"

using namespace deepinfer;
using namespace deepinfer::cuda;

namespace {

double median_ms(const std::function<void(int)>& run, int repeats = 20) {
  for (int i = 0; i < 3; ++i) run(i);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> times;
  for (int i = 0; i < repeats; ++i) {
    cudaEventRecord(start);
    run(i);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms);
  }
  check_launch("bench");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

DeviceBuffer random_bf16(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<uint16_t> host(count);
  for (uint16_t& v : host) v = f32_to_bf16(normal(rng));
  DeviceBuffer buffer(count * 2);
  buffer.upload(host.data(), buffer.bytes());
  return buffer;
}

// Batch-1 decode attention of one Llama-3.1-8B layer (32 heads over 8 KV heads): unsplit
// (8 blocks) and split as the engine splits it, the last split merging.
void bench_one_sequence_decode_attention(double bandwidth) {
  const int block_size = 16, heads = 32, kv_heads = 8, dim = 128, most = 8192;
  DeviceBuffer keys(int64_t{most} * kv_heads * dim * 4), values(keys.bytes());
  cudaMemset(keys.data(), 0x3c, keys.bytes());
  cudaMemset(values.data(), 0x3c, values.bytes());
  std::vector<int32_t> table(most / block_size);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  DeviceBuffer d_start(8), d_lens(4), d_table(table.size() * 4), arrivals(kv_heads * 4);
  d_table.upload(table.data(), d_table.bytes());
  cudaMemset(arrivals.data(), 0, arrivals.bytes());
  DeviceBuffer q(heads * dim * 4), out(heads * dim * 4);
  cudaMemset(q.data(), 0x3c, q.bytes());
  for (auto [context, dtype] : {std::pair{8192, DType::kF32}, std::pair{8192, DType::kBF16},
                                std::pair{1500, DType::kBF16}}) {
    std::vector<int32_t> start = {0, 1}, lens = {context};
    d_start.upload(start.data(), 8);
    d_lens.upload(lens.data(), 4);
    AttentionBatch batch{1,
                         d_start.as<int32_t>(),
                         d_lens.as<int32_t>(),
                         d_table.as<int32_t>(),
                         static_cast<int>(table.size()),
                         nullptr};
    PagedKvView cache{keys.data(), values.data(), block_size, kv_heads, dim, dim, false, dtype};
    double bytes = 2.0 * context * kv_heads * dim * double(dtype_size(dtype));
    for (int splits : {1, paged_attention_splits(1, kv_heads, context)}) {
      size_t floats = paged_attention_workspace_floats(1, kv_heads, splits);
      DeviceBuffer workspace(floats * 4);
      double ms = median_ms([&](int) {
        paged_attention(q.as<float>(), 1, heads, batch, cache, 0.088f, 0, out.as<float>(), nullptr,
                        SplitKeys{splits, arrivals.as<unsigned>(), kv_heads}, workspace.as<float>(),
                        floats);
      });
      fmt::print(
          "decode attention, 1 x {} tokens, {} K/V, {} split(s): {:.1f} MB in {:.4f} ms, "
          "{:.2f} TB/s ({:.0f}% of copy)\n",
          context, dtype_name(dtype), splits, bytes / 1e6, ms, bytes / (ms * 1e-3) / 1e12,
          100.0 * bytes / (ms * 1e-3) / 1e12 / bandwidth);
    }
  }
}
// Llama-3.1-8B's 32 layers of decode products as the model issues them: q/k/v and gate/up
// each one launch that first RMS-normalises x (staged in shared memory), o and down adding
// into the residual.
void bench_model_layer_products(double bandwidth) {
  DeviceBuffer qkv = random_bf16(6144 * 4096, 71), o = random_bf16(4096 * 4096, 72),
               gate_up = random_bf16(28672 * 4096, 73), down = random_bf16(4096 * 14336, 74);
  DeviceBuffer hidden(4096 * 4), act(28672 * 4), out(28672 * 4), norm(4096 * 2);
  cudaMemset(hidden.data(), 0x3c, hidden.bytes());
  cudaMemset(act.data(), 0x3c, act.bytes());
  cudaMemset(norm.data(), 0x3c, norm.bytes());
  const FewRowsNorm rms{norm.data(), DType::kBF16, 1e-5f};
  auto one = [](const DeviceBuffer& w, int64_t n, float* y, bool accumulate) {
    return FewRowsProduct{w.as<uint16_t>(), n, y, accumulate};
  };
  const FewRowsProduct qkv_job = one(qkv, 6144, out.as<float>(), false);
  const FewRowsProduct gate_up_job = one(gate_up, 28672, out.as<float>(), false);
  const FewRowsProduct o_job = one(o, 4096, hidden.as<float>(), true);
  const FewRowsProduct down_job = one(down, 4096, hidden.as<float>(), true);
  const double bytes = 32.0 * 2 * (6144 + 4096 + 28672) * 4096 + 32.0 * 2 * 4096 * 14336;
  double ms = median_ms([&](int) {
    for (int repeat = 0; repeat < 32; ++repeat) {
      matmul_bf16_few_rows(hidden.as<float>(), &qkv_job, 1, 1, 4096, nullptr, &rms);
      matmul_bf16_few_rows(act.as<float>(), &o_job, 1, 1, 4096);
      matmul_bf16_few_rows(hidden.as<float>(), &gate_up_job, 1, 1, 4096, nullptr, &rms);
      matmul_bf16_few_rows(act.as<float>(), &down_job, 1, 1, 14336);
    }
  });
  fmt::print(
      "8B decode products as the model issues them (norms inside q/k/v and gate/up, residual "
      "adds inside o and down): {:.2f} ms, {:.2f} TB/s ({:.0f}% of copy)\n",
      ms, bytes / (ms * 1e-3) / 1e12, 100.0 * bytes / (ms * 1e-3) / 1e12 / bandwidth);
}

// The fused gate/up + silu product at batch 1 (k = 4096) for widths that give every
// resident warp the same number of gate/up row pairs and for the 8B's 14,336, which does
// not: if the last round running on a fraction of the warps costs bandwidth, the uneven
// width shows it as a lower rate than its even neighbours.
void bench_gated_work_balance(double bandwidth) {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int64_t k = 4096, warps = int64_t{sms} * 3 * 8;  // three staged blocks of 8 warps an SM
  DeviceBuffer x(k * 4), norm(k * 2), act(5 * warps * 4);
  cudaMemset(x.data(), 0x3c, x.bytes());
  cudaMemset(norm.data(), 0x3c, norm.bytes());
  const FewRowsNorm rms{norm.data(), DType::kBF16, 1e-5f};
  fmt::print("\ngate/up + silu, batch 1, k = {} ({} resident warps if three blocks an SM fit)\n", k,
             warps);
  for (int64_t n : {4 * warps, int64_t{14336}, 5 * warps}) {
    DeviceBuffer gate = random_bf16(static_cast<size_t>(n * k), 81);
    DeviceBuffer up = random_bf16(static_cast<size_t>(n * k), 82);
    const double ms = median_ms([&](int) {
      matmul_bf16_few_rows_silu_gate(x.as<float>(), gate.as<uint16_t>(), up.as<uint16_t>(), 1, n, k,
                                     act.as<float>(), rms);
    });
    const double bytes = 2.0 * 2 * n * k;
    fmt::print("  n {:>6} ({:.2f} pairs a warp): {:.1f} us, {:.2f} TB/s ({:.0f}% of copy)\n", n,
               double(n) / double(warps), ms * 1e3, bytes / (ms * 1e-3) / 1e12,
               100.0 * bytes / (ms * 1e-3) / 1e12 / bandwidth);
  }
}

// One decoder layer of Llama-3.1-8B (fused q/k/v, o, fused gate/up, down) and the head.
struct Shape {
  const char* name;
  int64_t n, k;
};
constexpr Shape kShapes[] = {{"qkv", 6144, 4096},
                             {"o", 4096, 4096},
                             {"gate_up", 28672, 4096},
                             {"down", 4096, 14336},
                             {"lm_head", 128256, 4096}};

// Device-to-device copy of 2 GiB: the bandwidth every other line is measured against.
double copy_bandwidth() {
  const size_t copy_bytes = size_t{2} << 30;
  DeviceBuffer from = random_bf16(copy_bytes / 2, 1), to(copy_bytes);
  double copy_ms = median_ms(
      [&](int) { cudaMemcpyAsync(to.data(), from.data(), copy_bytes, cudaMemcpyDeviceToDevice); });
  double bandwidth = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e12;  // read + write
  fmt::print("copy: {:.2f} ms for 2 GiB, {:.2f} TB/s (read + write)\n", copy_ms, bandwidth);
  return bandwidth;
}

// Each product alone at batch 1, then what 32 such layers would take.
void bench_lone_products(double bandwidth) {
  fmt::print("\n{:<10} {:>10} {:>10} {:>12} {:>8}\n", "matrix", "MB", "ms", "TB/s", "of copy");
  double layer_ms = 0, layer_bytes = 0;
  for (const Shape& shape : kShapes) {
    const size_t weights = static_cast<size_t>(shape.n * shape.k);
    // Enough copies of the matrix that together they overflow L2.
    const int copies = static_cast<int>(std::max<size_t>(1, (size_t{256} << 20) / (weights * 2)));
    std::vector<DeviceBuffer> w;
    for (int c = 0; c < copies; ++c) w.push_back(random_bf16(weights, 10 + c));
    DeviceBuffer x(shape.k * 4), y(shape.n * 4);
    cudaMemset(x.data(), 0x3c, x.bytes());
    double ms = median_ms([&](int i) {
      matmul_bf16_few_rows(x.as<float>(), w[i % copies].as<uint16_t>(), 1, shape.n, shape.k,
                           y.as<float>());
    });
    double bytes = weights * 2.0;
    fmt::print("{:<10} {:>10.1f} {:>10.4f} {:>12.2f} {:>7.0f}%\n", shape.name, bytes / 1e6, ms,
               bytes / (ms * 1e-3) / 1e12, 100.0 * bytes / (ms * 1e-3) / 1e12 / bandwidth);
    if (std::string(shape.name) != "lm_head") {
      layer_ms += ms;
      layer_bytes += bytes;
    }
  }
  // 32 layers plus the head: the weight-streaming time of one decode step at batch 1.
  double step_ms = 32 * layer_ms, step_bytes = 32 * layer_bytes;
  fmt::print(
      "8B decode weights: {:.1f} GB in {:.2f} ms -> {:.0f} tokens/s ceiling from the "
      "products alone ({:.0f}% of copy bandwidth)\n",
      step_bytes / 1e9, step_ms, 1000.0 / step_ms,
      100.0 * step_bytes / (step_ms * 1e-3) / 1e12 / bandwidth);
}

// DeepSeek-V3's dense gate/up (2 x 18432 x 7168) in FP8 with 128 x 128 block scales.
void bench_fp8_gate_up(double bandwidth) {
  const int64_t n = 36864, k = 7168;
  std::vector<DeviceBuffer> w;
  for (int c = 0; c < 2; ++c) w.push_back(random_bf16(static_cast<size_t>(n * k / 2), 50 + c));
  DeviceBuffer scales(((n + 127) / 128) * ((k + 127) / 128) * 4), x(k * 4), y(n * 4);
  cudaMemset(scales.data(), 0x3c, scales.bytes());
  cudaMemset(x.data(), 0x3c, x.bytes());
  double ms = median_ms([&](int i) {
    matmul_fp8_few_rows(x.as<float>(), w[i % 2].as<uint8_t>(), scales.as<float>(), 1, n, k,
                        y.as<float>());
  });
  double bytes = static_cast<double>(n * k);
  fmt::print("fp8 gate_up 36864 x 7168 ({:.0f} MB): {:.4f} ms, {:.2f} TB/s ({:.0f}% of copy)\n",
             bytes / 1e6, ms, bytes / (ms * 1e-3) / 1e12,
             100.0 * bytes / (ms * 1e-3) / 1e12 / bandwidth);
}

// The same products back to back, as a decode step issues them (32 layers' worth): the
// per-launch cost without the gap a lone launch pays.
void bench_back_to_back_products(double bandwidth) {
  std::vector<DeviceBuffer> layer;
  for (const Shape& shape : kShapes)
    if (std::string(shape.name) != "lm_head")
      layer.push_back(random_bf16(static_cast<size_t>(shape.n * shape.k), 99));
  DeviceBuffer x(14336 * 4), y(28672 * 4);
  cudaMemset(x.data(), 0x3c, x.bytes());
  double ms = median_ms([&](int) {
    for (int repeat = 0; repeat < 32; ++repeat) {
      for (size_t m = 0; m < layer.size(); ++m) {
        matmul_bf16_few_rows(x.as<float>(), layer[m].as<uint16_t>(), 1, kShapes[m].n, kShapes[m].k,
                             y.as<float>());
      }
    }
  });
  double bytes = 0;
  for (size_t m = 0; m < layer.size(); ++m) bytes += 32.0 * kShapes[m].n * kShapes[m].k * 2;
  fmt::print(
      "8B decode products back to back (32 x 4 launches): {:.1f} GB in {:.2f} ms, "
      "{:.2f} TB/s ({:.0f}% of copy)\n",
      bytes / 1e9, ms, bytes / (ms * 1e-3) / 1e12, 100.0 * bytes / (ms * 1e-3) / 1e12 / bandwidth);
}

// Decode attention of one Llama-3.1-8B layer (32 heads over 8 KV heads of 128, f32 KV)
// for 64 sequences of 2,000 tokens: the K/V bytes each step must read once.
void bench_many_sequence_decode_attention(double bandwidth) {
  const int seqs = 64, context = 2000, block_size = 16, heads = 32, kv_heads = 8, dim = 128;
  const int blocks_per_seq = (context + block_size - 1) / block_size;
  const int64_t slots = int64_t{seqs} * blocks_per_seq * block_size;
  DeviceBuffer keys(slots * kv_heads * dim * 4), values(slots * kv_heads * dim * 4);
  cudaMemset(keys.data(), 0x3c, keys.bytes());
  cudaMemset(values.data(), 0x3c, values.bytes());
  std::vector<int32_t> start(seqs + 1), lens(seqs, context), table(seqs * blocks_per_seq);
  for (int s = 0; s <= seqs; ++s) start[s] = s;
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  DeviceBuffer d_start(start.size() * 4), d_lens(lens.size() * 4), d_table(table.size() * 4);
  d_start.upload(start.data(), d_start.bytes());
  d_lens.upload(lens.data(), d_lens.bytes());
  d_table.upload(table.data(), d_table.bytes());
  DeviceBuffer q(int64_t{seqs} * heads * dim * 4), out(int64_t{seqs} * heads * dim * 4);
  cudaMemset(q.data(), 0x3c, q.bytes());
  AttentionBatch batch{
      seqs,   d_start.as<int32_t>(), d_lens.as<int32_t>(), d_table.as<int32_t>(), blocks_per_seq,
      nullptr};
  PagedKvView cache{keys.as<float>(), values.as<float>(), block_size, kv_heads, dim, dim, false};
  // As the engine runs it: the keys split as paged_attention_splits says, the last split
  // merging.
  const int splits = paged_attention_splits(seqs, kv_heads, context);
  const size_t floats = paged_attention_workspace_floats(seqs, kv_heads, splits);
  DeviceBuffer workspace(floats * sizeof(float)), arrivals(seqs * kv_heads * 4);
  cudaMemset(arrivals.data(), 0, arrivals.bytes());
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    cache.dtype = dtype;  // a bf16 cache reads the first half of the same buffers
    double ms = median_ms([&](int) {
      paged_attention(q.as<float>(), seqs, heads, batch, cache, 0.088f, 0, out.as<float>(), nullptr,
                      SplitKeys{splits, arrivals.as<unsigned>(), seqs * kv_heads},
                      workspace.as<float>(), floats);
    });
    double bytes = 2.0 * seqs * context * kv_heads * dim * double(dtype_size(dtype));
    fmt::print(
        "decode attention, 64 x 2000 tokens, {} K/V, {} split(s), one layer: {:.1f} MB in "
        "{:.3f} ms, {:.2f} TB/s ({:.0f}% of copy)\n",
        dtype_name(dtype), splits, bytes / 1e6, ms, bytes / (ms * 1e-3) / 1e12,
        100.0 * bytes / (ms * 1e-3) / 1e12 / bandwidth);
  }
}

// Prompt attention of one Llama-3.1-8B layer over an 8192-token prompt (bf16 KV), the
// tensor-core kernel: causal, so half the L x L scores.
void bench_prompt_attention() {
  const int context = 8192, block_size = 16, heads = 32, kv_heads = 8, dim = 128;
  const int blocks = context / block_size;
  DeviceBuffer keys(int64_t{context} * kv_heads * dim * 2), values(keys.bytes());
  cudaMemset(keys.data(), 0x3c, keys.bytes());
  cudaMemset(values.data(), 0x3c, values.bytes());
  std::vector<int32_t> start = {0, context}, lens = {context}, table(blocks);
  for (int i = 0; i < blocks; ++i) table[i] = i;
  DeviceBuffer d_start(8), d_lens(4), d_table(table.size() * 4);
  d_start.upload(start.data(), 8);
  d_lens.upload(lens.data(), 4);
  d_table.upload(table.data(), d_table.bytes());
  DeviceBuffer q(int64_t{context} * heads * dim * 4), out(q.bytes());
  cudaMemset(q.data(), 0x3c, q.bytes());
  AttentionBatch batch{
      1,      d_start.as<int32_t>(), d_lens.as<int32_t>(), d_table.as<int32_t>(), blocks, nullptr,
      context};
  PagedKvView cache{keys.data(), values.data(), block_size, kv_heads,
                    dim,         dim,           false,      DType::kBF16};
  double ms = median_ms(
      [&](int) {
        flash_attention(q.as<float>(), context, heads, batch, cache, 0.088f, 0, out.as<float>());
      },
      5);
  double flops = 4.0 * heads * dim * double(context) * context / 2;
  fmt::print("prompt attention, 8192 tokens, one layer: {:.2f} ms, {:.0f} TFLOP/s\n", ms,
             flops / (ms * 1e-3) / 1e12);
}

// cuBLASLt on an 8192^3 bf16 product: the tensor cores' peak as our prompts meet it.
void bench_cublaslt_peak() {
  const int64_t m = 8192;
  DeviceBuffer a = random_bf16(m * m, 3), b32(m * m * 4), b16(m * m * 2), c(m * m * 4);
  cudaMemset(b32.data(), 0x3c, b32.bytes());
  LtMatmul lt;
  double gemm_ms = median_ms([&](int) {
    lt.run(b32.as<float>(), b16.as<uint16_t>(), a.as<uint16_t>(), DType::kBF16, m, m, m,
           c.as<float>());
  });
  fmt::print("\ncuBLASLt bf16 {}^3 (with the f32->bf16 cast of x): {:.3f} ms, {:.0f} TFLOP/s\n", m,
             gemm_ms, 2.0 * m * m * m / (gemm_ms * 1e-3) / 1e12);
}

}  // namespace

int main() {
  try {
    if (device_count() == 0) fail("no CUDA device");
    configure_few_rows_kernels();
    cudaDeviceProp properties{};
    cudaGetDeviceProperties(&properties, 0);
    fmt::print("device: {} ({} SMs, {} MB L2)\n", properties.name, properties.multiProcessorCount,
               properties.l2CacheSize >> 20);
    const double bandwidth = copy_bandwidth();
    bench_lone_products(bandwidth);
    bench_fp8_gate_up(bandwidth);
    bench_back_to_back_products(bandwidth);
    bench_model_layer_products(bandwidth);
    bench_gated_work_balance(bandwidth);
    bench_many_sequence_decode_attention(bandwidth);
    bench_prompt_attention();
    bench_one_sequence_decode_attention(bandwidth);
    bench_cublaslt_peak();
  } catch (const std::exception& error) {
    fmt::print(stderr, "cuda_bench: {}\n", error.what());
    return 1;
  }
  return 0;
}

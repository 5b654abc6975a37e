// Every CUDA kernel against the CPU ops on fresh random inputs. Tolerances (relative L2 norm
// of the difference): f32 elementwise work 1e-6; products with bf16 weights and f32
// activations 1e-5 (only the summation order differs); cuBLASLt, which rounds activations to
// bf16, 1e-2. Skipped, and saying so, where no GPU is present (CI builds it, the H200 runs it).
#include "kernels/cuda/cuda_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "core/dtype.h"
#include "kernels/ops.h"

namespace deepinfer::cuda {
namespace {

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
    configure_few_rows_kernels();  // what CudaOps does when it starts
    cpu_ = make_cpu_ops();
  }
  std::vector<float> random(size_t count, float scale = 1.0f) {
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> values(count);
    for (float& v : values) v = normal(rng_);
    return values;
  }
  static std::vector<uint16_t> to_bf16(const std::vector<float>& values) {
    std::vector<uint16_t> out(values.size());
    for (size_t i = 0; i < values.size(); ++i) out[i] = f32_to_bf16(values[i]);
    return out;
  }
  template <typename T>
  static DeviceBuffer upload(const std::vector<T>& host) {
    DeviceBuffer buffer(host.size() * sizeof(T));
    buffer.upload(host.data(), buffer.bytes());
    return buffer;
  }
  // Output buffers start as NaN so an element nothing wrote fails the comparison.
  static DeviceBuffer poisoned(size_t floats) {
    return upload(std::vector<float>(floats, std::nanf("")));
  }
  static std::vector<float> download(const DeviceBuffer& buffer) {
    std::vector<float> host(buffer.bytes() / sizeof(float));
    buffer.download(host.data(), buffer.bytes());
    return host;
  }
  static double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (!std::isfinite(got[i])) return INFINITY;
      diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
      norm += double(want[i]) * want[i];
    }
    return std::sqrt(diff / norm);
  }
  // A DeepSeek-style FP8 weight [n, k]: e4m3 values with a positive f32 scale per 128 x 128
  // block (ragged last blocks where n or k is not a multiple of 128), on the host for the
  // CPU's product and on the device.
  struct Fp8Weight {
    std::vector<uint8_t> bytes;
    std::vector<float> scales;
    BlockScales block;
    Tensor host;
    DeviceBuffer device, device_scales;
  };
  std::unique_ptr<Fp8Weight> fp8_weight(int64_t n, int64_t k) {
    auto w = std::make_unique<Fp8Weight>();
    const int64_t scale_rows = (n + 127) / 128, scale_cols = (k + 127) / 128;
    for (float value : random(static_cast<size_t>(n * k)))
      w->bytes.push_back(f32_to_f8e4m3(value * 10.0f));
    w->scales = random(static_cast<size_t>(scale_rows * scale_cols), 0.01f);
    for (float& scale : w->scales) scale = std::fabs(scale) + 1e-3f;
    w->block = {w->scales.data(), scale_rows, scale_cols, 128, 128};
    w->host = Tensor::contiguous(w->bytes.data(), DType::kF8E4M3, {n, k});
    w->host.block_scales = &w->block;
    w->device = upload(w->bytes);
    w->device_scales = upload(w->scales);
    return w;
  }

  std::mt19937 rng_{std::random_device{}()};
  std::unique_ptr<Ops> cpu_;
};

// Rows up to 1,024 aligned floats take one warp a row, the rest a block a row.
TEST_F(CudaKernels, RmsnormOfNarrowAndWideRows) {
  for (int64_t n : {int64_t{4096}, int64_t{1024}, int64_t{512}, int64_t{130}}) {
    const int64_t rows = 13;
    std::vector<float> x = random(rows * n), weight = random(n);
    std::vector<uint16_t> weight_bf16 = to_bf16(weight);
    std::vector<float> want(rows * n);
    Tensor want_t = Tensor::contiguous(want.data(), DType::kF32, {rows, n});
    cpu_->rmsnorm(Tensor::contiguous(x.data(), DType::kF32, {rows, n}),
                  Tensor::contiguous(weight_bf16.data(), DType::kBF16, {n}), 1e-6f, want_t);
    DeviceBuffer dx = upload(x), dw = upload(weight_bf16), dy = poisoned(rows * n);
    rmsnorm(dx.as<float>(), n, dw.data(), DType::kBF16, rows, n, 1e-6f, dy.as<float>(), n);
    EXPECT_LT(relative_error(download(dy), want), 1e-6) << n;
  }
}

TEST_F(CudaKernels, RmsnormSiluMulAddEmbedding) {
  const int64_t rows = 7, n = 4096;
  std::vector<float> x = random(rows * n), weight = random(n), up = random(rows * n);
  std::vector<uint16_t> weight_bf16 = to_bf16(weight);
  Tensor x_host = Tensor::contiguous(x.data(), DType::kF32, {rows, n});
  Tensor w_host = Tensor::contiguous(weight_bf16.data(), DType::kBF16, {n});
  std::vector<float> want(rows * n);
  Tensor want_t = Tensor::contiguous(want.data(), DType::kF32, {rows, n});
  cpu_->rmsnorm(x_host, w_host, 1e-6f, want_t);
  DeviceBuffer dx = upload(x), dw = upload(weight_bf16), dy = poisoned(rows * n);
  rmsnorm(dx.as<float>(), n, dw.data(), DType::kBF16, rows, n, 1e-6f, dy.as<float>(), n);
  EXPECT_LT(relative_error(download(dy), want), 1e-6);

  Tensor up_host = Tensor::contiguous(up.data(), DType::kF32, {rows, n});
  cpu_->silu_mul(x_host, up_host, want_t);
  DeviceBuffer dup = upload(up), dout = poisoned(rows * n);
  silu_mul(dx.as<float>(), dup.as<float>(), dout.as<float>(), rows * n);
  EXPECT_LT(relative_error(download(dout), want), 1e-6);

  std::vector<float> sum = x;
  Tensor sum_t = Tensor::contiguous(sum.data(), DType::kF32, {rows, n});
  cpu_->add(sum_t, up_host);
  add(dx.as<float>(), dup.as<float>(), rows * n);
  EXPECT_LT(relative_error(download(dx), sum), 1e-6);

  const int64_t vocab = 1000;
  std::vector<uint16_t> table = to_bf16(random(vocab * n));
  std::vector<int32_t> ids = {5, 999, 0, 5, 431, 17, 2};
  cpu_->embedding(Tensor::contiguous(table.data(), DType::kBF16, {vocab, n}), ids.data(), want_t);
  DeviceBuffer dtable = upload(table), dids = upload(ids), demb = poisoned(rows * n);
  embedding(dtable.data(), DType::kBF16, n, dids.as<int32_t>(), rows, demb.as<float>(), vocab);
  EXPECT_EQ(download(demb), want);  // a copy: exact
}

TEST_F(CudaKernels, RopeBothLayouts) {
  const int64_t tokens = 5;
  const int heads = 4, head_dim = 128;
  for (bool interleaved : {false, true}) {
    for (int rotary_dim : {128, 64}) {
      std::vector<float> x = random(tokens * heads * head_dim);
      std::vector<float> cos = random(tokens * rotary_dim / 2),
                         sin = random(tokens * rotary_dim / 2);
      std::vector<float> want = x;
      Tensor want_t = Tensor::contiguous(want.data(), DType::kF32, {tokens, heads, head_dim});
      cpu_->rope(want_t, cos.data(), sin.data(), rotary_dim, interleaved);
      DeviceBuffer dx = upload(x), dcos = upload(cos), dsin = upload(sin);
      rope(dx.as<float>(), {heads * head_dim, head_dim}, dcos.as<float>(), dsin.as<float>(), tokens,
           heads, rotary_dim, interleaved);
      EXPECT_LT(relative_error(download(dx), want), 1e-6) << interleaved << " " << rotary_dim;
    }
  }
}

TEST_F(CudaKernels, Bf16MatmulsMatchTheCpu) {
  const int64_t n = 1536, k = 2048;
  std::vector<uint16_t> weight = to_bf16(random(n * k, 0.05f));
  Tensor w_host = Tensor::contiguous(weight.data(), DType::kBF16, {n, k});
  DeviceBuffer dw = upload(weight);
  LtMatmul lt;
  for (int64_t rows : {1, 3, 8, 37, 256}) {
    std::vector<float> x = random(rows * k);
    std::vector<float> want(rows * n);
    Tensor want_t = Tensor::contiguous(want.data(), DType::kF32, {rows, n});
    cpu_->matmul(Tensor::contiguous(x.data(), DType::kF32, {rows, k}), w_host, nullptr, want_t);
    DeviceBuffer dx = upload(x), dy = poisoned(rows * n);
    if (rows <= 8) {
      matmul_bf16_few_rows(dx.as<float>(), dw.as<uint16_t>(), rows, n, k, dy.as<float>());
      EXPECT_LT(relative_error(download(dy), want), 1e-5) << rows << " rows";
      dy = poisoned(rows * n);
    }
    DeviceBuffer dx_bf16(rows * k * sizeof(uint16_t));
    lt.run(dx.as<float>(), dx_bf16.as<uint16_t>(), dw.as<uint16_t>(), DType::kBF16, rows, n, k,
           dy.as<float>());
    synchronize();
    EXPECT_LT(relative_error(download(dy), want), 1e-2) << rows << " rows (cuBLASLt)";
  }
}

// The row stream (weights through shared memory in large bulk copies) against the register
// path, the same bits: plain products (the 8B's o and down shapes, a width that leaves the
// last stage part full, one and two rows, writing and adding into y), one product of
// normalised x, and gate/up + silu; with bulk copies of at most 4, 16 and 64 KB (smallest
// first, so a fault names the copy size that brings it).
TEST_F(CudaKernels, RowStreamGivesTheRegisterPathsBits) {
  struct Case {
    int64_t n, k, rows;
  };
  std::vector<uint16_t> norm = to_bf16(random(14336, 0.5f));
  DeviceBuffer d_norm = upload(norm);
  const FewRowsNorm rms{d_norm.data(), DType::kBF16, 1e-5f};
  const Case cases[] = {{4096, 4096, 1}, {4096, 14336, 1}, {1001, 4096, 2}, {4100, 2048, 1}};
  const int default_uses = row_stream();
  for (uint32_t limit : {4u << 10, 16u << 10, 64u << 10}) {
    set_row_stream_copy_limit(limit);
    for (const Case c : cases) {
      std::vector<uint16_t> weight = to_bf16(random(c.n * c.k, 0.05f));
      std::vector<uint16_t> up = to_bf16(random(c.n * c.k, 0.05f));
      DeviceBuffer dw = upload(weight), d_up = upload(up), dx = upload(random(c.rows * c.k));
      const std::vector<float> start = random(c.rows * c.n);
      // 0, 1: plain, writing and adding; 2: normalised x; 3: gate/up + silu.
      for (int variant = 0; variant < 4; ++variant) {
        // Named on stderr first: a kernel fault ends the process before gtest reports.
        std::fprintf(stderr, "row stream: copies <= %u bytes, %ld x %ld, %ld rows, variant %d\n",
                     limit, long(c.n), long(c.k), long(c.rows), variant);
        std::vector<float> got[2];
        for (bool streamed : {false, true}) {
          set_row_stream(streamed ? kStreamPlain | kStreamGated | kStreamNormalised : 0);
          DeviceBuffer dy = upload(start);
          const FewRowsProduct job{dw.as<uint16_t>(), c.n, dy.as<float>(), variant == 1};
          if (variant == 3) {
            matmul_bf16_few_rows_silu_gate(dx.as<float>(), dw.as<uint16_t>(), d_up.as<uint16_t>(),
                                           c.rows, c.n, c.k, dy.as<float>(), rms);
          } else {
            matmul_bf16_few_rows(dx.as<float>(), &job, 1, c.rows, c.k, nullptr,
                                 variant == 2 ? &rms : nullptr);
          }
          synchronize();
          got[streamed] = download(dy);
        }
        set_row_stream(default_uses);
        EXPECT_EQ(got[0], got[1]) << c.n << " x " << c.k << ", " << c.rows << " rows, variant "
                                  << variant << ", copies <= " << limit;
      }
    }
  }
  set_row_stream_copy_limit(16 << 10);
}

// A norm's weights are copied into shared memory before the wait for the previous kernel
// when 16-byte aligned, and read where they lie otherwise: both give the same bits, on the
// register path and the row stream, for one normalised product and for gate/up + silu.
TEST_F(CudaKernels, NormWeightsGiveTheSameBitsAlignedOrNot) {
  const int64_t n = 1001, k = 4096;
  std::vector<uint16_t> norm = to_bf16(random(k, 0.5f));
  std::vector<uint16_t> shifted(k + 1);
  std::copy(norm.begin(), norm.end(), shifted.begin() + 1);
  DeviceBuffer d_norm = upload(norm), d_shifted = upload(shifted);
  const FewRowsNorm aligned{d_norm.data(), DType::kBF16, 1e-5f};
  const FewRowsNorm unaligned{d_shifted.as<uint16_t>() + 1, DType::kBF16, 1e-5f};
  DeviceBuffer dw = upload(to_bf16(random(n * k, 0.05f)));
  DeviceBuffer d_up = upload(to_bf16(random(n * k, 0.05f)));
  DeviceBuffer dx = upload(random(2 * k));
  const int default_uses = row_stream();
  for (int64_t rows : {1, 2}) {
    for (bool gated : {false, true}) {
      std::vector<float> want;
      for (bool streamed : {false, true}) {
        set_row_stream(streamed ? kStreamGated | kStreamNormalised : 0);
        for (const FewRowsNorm* rms : {&aligned, &unaligned}) {
          DeviceBuffer dy = upload(std::vector<float>(rows * n, 0.0f));
          const FewRowsProduct job{dw.as<uint16_t>(), n, dy.as<float>(), false};
          if (gated) {
            matmul_bf16_few_rows_silu_gate(dx.as<float>(), dw.as<uint16_t>(), d_up.as<uint16_t>(),
                                           rows, n, k, dy.as<float>(), *rms);
          } else {
            matmul_bf16_few_rows(dx.as<float>(), &job, 1, rows, k, nullptr, rms);
          }
          synchronize();
          const std::vector<float> got = download(dy);
          if (want.empty()) want = got;
          EXPECT_EQ(got, want) << rows << " rows, " << (gated ? "gate/up" : "one product")
                               << (streamed ? ", streamed" : ", registers")
                               << (rms == &aligned ? ", aligned" : ", unaligned");
        }
      }
    }
  }
  set_row_stream(default_uses);
}

// DeepSeek-style FP8: e4m3 weights with a scale per 128 x 128 block, against the CPU's
// block-scaled product (ragged last blocks in both directions).
TEST_F(CudaKernels, Fp8BlockScaledMatmulMatchesTheCpu) {
  const int64_t n = 1000, k = 2000;
  std::unique_ptr<Fp8Weight> w = fp8_weight(n, k);
  for (int64_t rows : {1, 5, 8}) {
    std::vector<float> x = random(rows * k);
    std::vector<float> want(rows * n);
    Tensor want_t = Tensor::contiguous(want.data(), DType::kF32, {rows, n});
    cpu_->matmul(Tensor::contiguous(x.data(), DType::kF32, {rows, k}), w->host, nullptr, want_t);
    DeviceBuffer dx = upload(x), dy = poisoned(rows * n);
    matmul_fp8_few_rows(dx.as<float>(), w->device.as<uint8_t>(), w->device_scales.as<float>(), rows,
                        n, k, dy.as<float>());
    EXPECT_LT(relative_error(download(dy), want), 1e-5) << rows << " rows";
  }
}

// x quantised as LtMatmul::run_fp8 quantises it (e4m3, one scale per row per 128 columns),
// returned widened again: what the FP8 product multiplies.
std::vector<float> fp8_activations(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t start = 0; start < x.size(); start += static_cast<size_t>(kFp8Group)) {
    float largest = 0.0f;
    for (int64_t i = 0; i < kFp8Group; ++i) largest = std::max(largest, std::fabs(x[start + i]));
    const float scale = largest > 0.0f ? largest / 448.0f : 1.0f;
    for (int64_t i = 0; i < kFp8Group; ++i)
      out[start + i] = f8e4m3_to_f32(f32_to_f8e4m3(x[start + i] * (1.0f / scale))) * scale;
  }
  return out;
}

// Prompt-sized FP8 products on cuBLASLt's block-scaled kernels (128 x 128 weight blocks,
// 1 x 128 activation groups), against the CPU's product of the same quantised activations;
// a weight whose rows end in a partial block, and row counts that are not multiples of 4.
TEST_F(CudaKernels, Fp8BlockScaledPromptProductsMatchTheCpu) {
  LtMatmul lt;
  // k = 1152: 9 scale blocks a row, which cuBLASLt needs padded to 12.
  for (int64_t k : {1024, 1152}) {
    const int64_t n = 1008;
    ASSERT_TRUE(LtMatmul::fp8_fits(n, k));
    std::unique_ptr<Fp8Weight> w = fp8_weight(n, k);
    for (int64_t rows : {9, 64, 333}) {
      std::vector<float> x = random(rows * k);
      for (size_t i = 0; i < x.size(); i += 7) x[i] *= 30.0f;  // groups of unlike ranges
      std::vector<float> quantised = fp8_activations(x);
      std::vector<float> want(rows * n);
      Tensor want_t = Tensor::contiguous(want.data(), DType::kF32, {rows, n});
      cpu_->matmul(Tensor::contiguous(quantised.data(), DType::kF32, {rows, k}), w->host, nullptr,
                   want_t);
      DeviceBuffer dx = upload(x), dy = poisoned(rows * n);
      DeviceBuffer scratch(LtMatmul::fp8_scratch_bytes(rows, n, k));
      ASSERT_TRUE(lt.run_fp8(dx.as<float>(), scratch.data(), w->device.as<uint8_t>(),
                             w->device_scales.as<float>(), rows, n, k, dy.as<float>()));
      EXPECT_LT(relative_error(download(dy), want), 1e-3) << rows << " rows, k " << k;
    }
  }
}

// Host only: the workspace the backend sets aside once covers every split choice (a decode
// graph may not allocate between its kernels).
TEST(PagedAttentionSplits, TheWorkspaceLimitCoversEveryChoice) {
  size_t most = 0;
  for (int64_t rows = 1; rows <= 4096; rows += rows < 64 ? 1 : 37)
    for (int kv_heads : {1, 2, 4, 8, 16, 32, 64, 128})
      for (int64_t context : {1, 31, 32, 33, 500, 4096, 131072, 1 << 20}) {
        const int splits = paged_attention_splits(rows, kv_heads, context);
        ASSERT_GE(splits, 1);
        if (splits == 1) continue;
        const size_t floats = paged_attention_workspace_floats(rows, kv_heads, splits);
        ASSERT_LE(floats, paged_attention_workspace_limit_floats())
            << rows << " rows, " << kv_heads << " KV heads, " << context << " tokens";
        most = std::max(most, floats);
      }
  // The bound is not slack by more than twice what is used.
  EXPECT_GE(2 * most, paged_attention_workspace_limit_floats());
}

// Sequences in one batch: a decode row, a prefill chunk and a whole short prompt, their
// blocks scattered through the pool; GQA with separate values and MLA's values-in-keys,
// with and without a window.
TEST_F(CudaKernels, PagedAttentionAndKvWriteMatchTheCpu) {
  struct Layout {
    int heads, kv_heads, key_dim, value_dim;
    bool values_in_keys;
  };
  const int block_size = 16, num_blocks = 64, max_blocks = 8;
  const std::vector<int32_t> context = {37, 100, 16}, queries = {1, 7, 16};
  std::vector<int32_t> query_start = {0};
  for (int32_t count : queries) query_start.push_back(query_start.back() + count);
  const int64_t rows = query_start.back();
  std::vector<int32_t> blocks(num_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng_);
  std::vector<int32_t> tables(context.size() * max_blocks);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = blocks[i];
  // The slots of every sequence's new tokens (the last `queries` of its context).
  std::vector<int64_t> slots;
  for (size_t s = 0; s < context.size(); ++s) {
    for (int32_t p = context[s] - queries[s]; p < context[s]; ++p)
      slots.push_back(int64_t{tables[s * max_blocks + p / block_size]} * block_size +
                      p % block_size);
  }
  DeviceBuffer d_start = upload(query_start), d_context = upload(context),
               d_tables = upload(tables), d_slots = upload(slots);
  for (const Layout& layout : {Layout{8, 2, 128, 128, false}, Layout{4, 4, 128, 128, false},
                               Layout{6, 2, 64, 64, false}, Layout{16, 1, 576, 512, true}}) {
    const int64_t key_width = int64_t{layout.kv_heads} * layout.key_dim;
    const int64_t value_width = int64_t{layout.kv_heads} * layout.value_dim;
    const int64_t pool = int64_t{num_blocks} * block_size;
    std::vector<float> keys = random(pool * key_width);
    std::vector<float> values =
        layout.values_in_keys ? std::vector<float>() : random(pool * value_width);
    std::vector<float> new_keys = random(rows * key_width), new_values = random(rows * value_width);
    PagedKvView host_cache{
        keys.data(),          layout.values_in_keys ? keys.data() : values.data(),
        block_size,           layout.kv_heads,
        layout.key_dim,       layout.value_dim,
        layout.values_in_keys};
    AttentionBatch host_batch{static_cast<int>(context.size()),
                              query_start.data(),
                              context.data(),
                              tables.data(),
                              max_blocks,
                              slots.data()};
    DeviceBuffer d_keys = upload(keys), d_values = upload(values);
    PagedKvView device_cache = host_cache;
    device_cache.keys = d_keys.as<float>();
    device_cache.values = layout.values_in_keys ? d_keys.as<float>() : d_values.as<float>();
    AttentionBatch device_batch{
        host_batch.num_seqs, d_start.as<int32_t>(), d_context.as<int32_t>(), d_tables.as<int32_t>(),
        max_blocks,          d_slots.as<int64_t>()};

    Tensor k_host = Tensor::contiguous(new_keys.data(), DType::kF32, {rows, key_width});
    Tensor v_host = Tensor::contiguous(new_values.data(), DType::kF32, {rows, value_width});
    cpu_->kv_write(k_host, layout.values_in_keys ? nullptr : &v_host, host_batch, host_cache);
    DeviceBuffer d_new_keys = upload(new_keys), d_new_values = upload(new_values);
    kv_write(d_new_keys.as<float>(), layout.values_in_keys ? nullptr : d_new_values.as<float>(),
             d_slots.as<int64_t>(), rows, device_cache);
    EXPECT_EQ(download(d_keys), keys);
    if (!layout.values_in_keys) {
      EXPECT_EQ(download(d_values), values);
    }

    std::vector<float> q = random(rows * layout.heads * layout.key_dim);
    DeviceBuffer d_q = upload(q);
    for (int window : {0, 24}) {
      std::vector<float> want(rows * layout.heads * layout.value_dim);
      Tensor want_t =
          Tensor::contiguous(want.data(), DType::kF32, {rows, layout.heads, layout.value_dim});
      Tensor q_t = Tensor::contiguous(q.data(), DType::kF32, {rows, layout.heads, layout.key_dim});
      float scale = 1.0f / std::sqrt(static_cast<float>(layout.key_dim));
      cpu_->paged_attention(q_t, host_batch, host_cache, scale, window, want_t);
      // Every row (a lane per key), and the decode row alone (four lanes per key); unsplit,
      // and split over blocks (ignored by the general kernel) merged by a merge kernel or
      // by the last split to finish: the same result.
      for (int64_t used : {rows, int64_t{1}}) {
        AttentionBatch used_batch = device_batch;
        used_batch.num_seqs = used == rows ? host_batch.num_seqs : 1;
        const size_t used_floats = static_cast<size_t>(used * layout.heads * layout.value_dim);
        const std::vector<float> used_want(want.begin(), want.begin() + used_floats);
        for (int splits : {1, 3, 7}) {
          for (bool arrive : {false, true}) {
            size_t floats = paged_attention_workspace_floats(used, layout.kv_heads, splits);
            DeviceBuffer workspace(floats * sizeof(float)), d_out = poisoned(used_floats);
            const int64_t counters = arrive ? used * layout.kv_heads : 0;
            DeviceBuffer arrivals =
                upload(std::vector<unsigned>(std::max<int64_t>(counters, 1), 0));
            paged_attention(d_q.as<float>(), used, layout.heads, used_batch, device_cache, scale,
                            window, d_out.as<float>(), nullptr,
                            SplitKeys{splits, arrive ? arrivals.as<unsigned>() : nullptr, counters},
                            splits > 1 ? workspace.as<float>() : nullptr, floats);
            EXPECT_LT(relative_error(download(d_out), used_want), 1e-5)
                << layout.key_dim << " rows " << used << " window " << window << " splits "
                << splits << (arrive ? " merged by the last split" : "");
            std::vector<unsigned> left(arrivals.bytes() / sizeof(unsigned));
            arrivals.download(left.data(), arrivals.bytes());
            EXPECT_EQ(left, std::vector<unsigned>(left.size(), 0)) << "arrivals reset";
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::cuda

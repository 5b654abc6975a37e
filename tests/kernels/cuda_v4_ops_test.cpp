// DeepSeek-V4's operations on the GPU against the CPU: hyper-connections, paged records,
// compression of CSA- and HCA-style windows, the lightning indexer's choice and attention
// over the window, the chosen (or all causal) entries and the sinks.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <tuple>

#include "kernels/cuda/deepseek_v4_kernels.h"
#include "kernels/cuda_parity.h"
#include "kv/kv_cache.h"

namespace deepinfer::cuda {
namespace {

using testing::Both;
using testing::CudaOpsParity;
using testing::kBf16Activations;
using testing::kExact;
using testing::kF32Products;

// Stream counts of one, V4's four, an odd five and a wide 40; widths below one chunk of the
// partial products and across several; token counts that leave a tile part-filled.
class CudaHyperConnections
    : public CudaOpsParity,
      public ::testing::WithParamInterface<std::tuple<int, int64_t, int64_t>> {};

TEST_P(CudaHyperConnections, MatchTheCpu) {
  const auto [streams, width, tokens] = GetParam();
  const int64_t mixes = (2 + streams) * streams;
  Both x = random({tokens, streams * width});
  Both fn = random({mixes, streams * width}, DType::kF32, 0.05f);
  Both base = random({mixes}), scale = random({3}, DType::kF32, 0.5f);
  Both head_fn = random({streams, streams * width}, DType::kF32, 0.05f);
  Both head_base = random({streams}), head_scale = random({1});
  auto site = [&](const Both& f, const Both& b, const Both& s, bool device) {
    return HyperConnection{device ? &f.device_view : &f.host_view,
                           device ? &b.device_view : &b.host_view,
                           device ? &s.device_view : &s.host_view,
                           streams,
                           20,
                           1e-6f,
                           1e-6f};
  };
  Both mix = output({tokens, mixes}), collapsed = output({tokens, width});
  cpu_->hc_pre(x.host_view, site(fn, base, scale, false), &mix.host_view, collapsed.host_view);
  gpu_->hc_pre(x.device_view, site(fn, base, scale, true), &mix.device_view, collapsed.device_view);
  EXPECT_LT(error(mix), kF32Products);
  EXPECT_LT(error(collapsed), kF32Products);
  // The same mix on both sides for the residual update.
  Both same_mix = make(host_floats(mix), DType::kF32, {tokens, mixes});
  Both out = random({tokens, width});
  cpu_->hc_post(out.host_view, same_mix.host_view, x.host_view);
  gpu_->hc_post(out.device_view, same_mix.device_view, x.device_view);
  EXPECT_LT(error(x), kExact);
  Both hidden = output({tokens, width});
  cpu_->hc_pre(x.host_view, site(head_fn, head_base, head_scale, false), nullptr, hidden.host_view);
  gpu_->hc_pre(x.device_view, site(head_fn, head_base, head_scale, true), nullptr,
               hidden.device_view);
  EXPECT_LT(error(hidden), kF32Products);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaHyperConnections,
                         ::testing::Values(std::tuple{4, int64_t{96}, int64_t{7}},
                                           std::tuple{1, int64_t{300}, int64_t{1}},
                                           std::tuple{4, int64_t{1100}, int64_t{9}},
                                           std::tuple{5, int64_t{257}, int64_t{17}},
                                           std::tuple{40, int64_t{33}, int64_t{3}}));

// Paged state of two sequences (43 and 300 tokens, every token a new row): compressor inputs
// over three cache layers, entries of a CSA-style (overlapping, rate 4) and an HCA-style
// (rate 8) compressor in stripes, then selection and attention on both backends.
class CudaV4Records : public CudaOpsParity {
 protected:
  static constexpr int kRow = 32, kBlock = 16, kMaxBlocks = 19, kLayers = 6, kPool = 64;

  void SetUp() override {
    CudaOpsParity::SetUp();
    if (IsSkipped()) return;
    batch_ = paged_batch({0, 43, 343}, {43, 300}, kBlock, kMaxBlocks);
    KvCacheShape shape{kLayers, 1, kRow, kRow, kBlock, true, {}, DType::kF32};
    cpu_cache_ = std::make_unique<KvCache>(shape, kPool);
    gpu_cache_ = std::make_unique<KvCache>(shape, kPool, *gpu_);
    // Caches start as zeros on both sides.
    std::vector<float> zeros(static_cast<size_t>(kPool) * kBlock * kRow, 0.0f);
    for (int l = 0; l < kLayers; ++l)
      gpu_->to_backend(gpu_cache_->layer(l).keys, zeros.data(), zeros.size() * 4);
  }

  // Heads, head size and the entries' rate (stripes of dim / rate floats, at most kRow).
  struct AttentionShape {
    int heads = 10, dim = 64, rate = 4;
  };

  // Up to k entries a row of `queries` chosen at random among those complete at its position
  // (some -1, skipped).
  std::vector<int32_t> random_choices(const PagedBatch& queries, int k, int rate) {
    std::vector<int32_t> chosen;
    for (size_t s = 0; s + 1 < queries.query_start.size(); ++s) {
      const int32_t rows = queries.query_start[s + 1] - queries.query_start[s];
      for (int32_t r = 0; r < rows; ++r) {
        const int32_t position = queries.context_lens[s] - rows + r;
        std::uniform_int_distribution<int> pick(-1, std::max(0, (position + 1) / rate - 1));
        for (int i = 0; i < k; ++i) {
          const int w = pick(rng_);
          chosen.push_back(w < (position + 1) / rate ? w : -1);
        }
      }
    }
    return chosen;
  }

  // Attention of the shape's heads for the rows of `queries` over window rows (written for
  // every token of batch_) and entries striped at the shape's rate: the `chosen` ones (k a row,
  // -1 skipped) or every causal one, on both backends. Rows the GPU takes to its tensor cores
  // round to bf16 there.
  void expect_attention_matches(const PagedBatch& queries, int window,
                                const std::vector<int32_t>& chosen, int k, AttentionShape shape) {
    const auto rows = static_cast<int64_t>(chosen.size()) / k;
    const int64_t stripe = (shape.dim + shape.rate - 1) / shape.rate;
    ASSERT_LE(stripe, kRow);
    Both stripes = random({343, stripe});
    cpu_->write_records(stripes.host_view, batch_->host, records(false, 0, 0));
    gpu_->write_records(stripes.device_view, batch_->device, records(true, 0, 0));
    KvCacheShape window_shape{1, 1, shape.dim, shape.dim, kBlock, true, {}, DType::kF32};
    KvCache cpu_window(window_shape, kPool), gpu_window(window_shape, kPool, *gpu_);
    Both keys = random({343, 1, shape.dim});
    cpu_->kv_write(keys.host_view, nullptr, batch_->host, cpu_window.layer(0));
    gpu_->kv_write(keys.device_view, nullptr, batch_->device, gpu_window.layer(0));
    BackendMemory device_chosen = gpu_->allocate(chosen.size() * 4);
    gpu_->to_backend(device_chosen.get(), chosen.data(), chosen.size() * 4);
    Both q = random({rows, shape.heads, shape.dim}), sinks = random({shape.heads});
    const double tolerance = sparse_attention_on_tensor_cores(rows, shape.heads, shape.dim)
                                 ? kBf16Activations
                                 : kF32Products;
    for (bool sparse : {true, false}) {
      Both out = output({rows, shape.heads, shape.dim});
      cpu_->sparse_attention(q.host_view, queries.host, cpu_window.layer(0), window,
                             EntryStripes{records(false, 0, 0), stripe, shape.rate},
                             sparse ? chosen.data() : nullptr, k, sinks.host_view, 0.125f,
                             out.host_view);
      gpu_->sparse_attention(q.device_view, queries.device, gpu_window.layer(0), window,
                             EntryStripes{records(true, 0, 0), stripe, shape.rate},
                             sparse ? static_cast<const int32_t*>(device_chosen.get()) : nullptr, k,
                             sinks.device_view, 0.125f, out.device_view);
      EXPECT_LT(error(out), tolerance) << (sparse ? "chosen entries" : "every entry");
    }
  }

  PagedRecords records(bool device, int first_layer, int64_t offset) const {
    KvCache& cache = device ? *gpu_cache_ : *cpu_cache_;
    PagedRecords r;
    for (int l = first_layer; l < kLayers; ++l) {
      r.layers.push_back(cache.layer(l).key_floats());
      r.tables.push_back(device ? batch_->device.block_tables : batch_->host.block_tables);
    }
    r.max_blocks_per_seq = kMaxBlocks;
    r.block_size = kBlock;
    r.row = kRow;
    r.offset = offset;
    return r;
  }

  // The cache layers' contents on both sides, relative error.
  double cache_error(int layer) const {
    size_t count = static_cast<size_t>(kPool) * kBlock * kRow;
    std::vector<float> want(cpu_cache_->layer(layer).key_floats(),
                            cpu_cache_->layer(layer).key_floats() + count);
    std::vector<float> got(count);
    gpu_->to_host(got.data(), gpu_cache_->layer(layer).keys, count * 4);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < count; ++i) {
      diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
      norm += double(want[i]) * want[i];
    }
    return std::sqrt(diff / std::max(norm, 1e-30));
  }

  std::unique_ptr<PagedBatch> batch_;
  std::unique_ptr<KvCache> cpu_cache_, gpu_cache_;
};

TEST_F(CudaV4Records, CompressionSelectionAndAttentionMatchTheCpu) {
  const int64_t tokens = 343;
  // Each token's inputs: 112 floats at offset 3 of cache layers 0-3. Entries from layer 4
  // on: the CSA-style entry (16 attention + 8 key floats over 4 tokens, stripe 6) at record
  // offset 0, the HCA-style one (24 floats over 8 tokens, stripe 3) at offset 6.
  const int csa_width = 16, key_width = 8, hca_width = 24;
  Both inputs = random({tokens, 112});
  cpu_->write_records(inputs.host_view, batch_->host, records(false, 0, 3));
  gpu_->write_records(inputs.device_view, batch_->device, records(true, 0, 3));
  for (int l = 0; l < 4; ++l) EXPECT_LT(cache_error(l), kExact) << "input layer " << l;

  Both csa_bias = random({4, 2 * csa_width}), key_bias = random({4, 2 * key_width});
  Both hca_bias = random({8, hca_width});
  Both csa_norm = random({csa_width}), key_norm = random({key_width});
  Both hca_norm = random({hca_width});
  struct Part {
    Both *bias, *norm;
    int width, rate;
    bool overlapping;
    int64_t input_offset, entry_offset, stripe_offset, stripe;
  };
  // Inputs: CSA values and gates at 0 (2 x 32), the key compressor's at 64 (2 x 16) and the
  // HCA's at 64 too (2 x 24): any floats will do for pooling.
  const Part parts[] = {{&csa_bias, &csa_norm, csa_width, 4, true, 0, 0, 0, 6},
                        {&key_bias, &key_norm, key_width, 4, true, 64, csa_width, 0, 6},
                        {&hca_bias, &hca_norm, hca_width, 8, false, 64, 0, 6, 3}};
  const int rope_dims = 8;
  for (const Part& part : parts) {
    std::vector<int32_t> windows;
    for (int s = 0; s < 2; ++s) {
      for (int w = 0; (w + 1) * part.rate <= batch_->context_lens[static_cast<size_t>(s)]; ++w)
        windows.insert(windows.end(), {s, w});
      windows.insert(windows.end(), {-1, 0});  // skipped, as a recorded step's idle rows
    }
    const int64_t jobs = static_cast<int64_t>(windows.size() / 2);
    BackendMemory device_windows = gpu_->allocate(windows.size() * sizeof(int32_t));
    gpu_->to_backend(device_windows.get(), windows.data(), windows.size() * sizeof(int32_t));
    Both cos = random({jobs, rope_dims / 2}), sin = random({jobs, rope_dims / 2});
    for (bool device : {false, true}) {
      Compressor c;
      c.position_bias = device ? &part.bias->device_view : &part.bias->host_view;
      c.norm = device ? &part.norm->device_view : &part.norm->host_view;
      c.width = part.width;
      c.rate = part.rate;
      c.overlapping = part.overlapping;
      c.input_offset = part.input_offset;
      c.entry_offset = part.entry_offset;
      c.eps = 1e-6f;
      c.rope_dims = rope_dims;
      EntryStripes entries{records(device, 4, part.stripe_offset), part.stripe, part.rate};
      (device ? gpu_ : cpu_)
          ->compress_windows(
              records(device, 0, 3), c,
              device ? static_cast<const int32_t*>(device_windows.get()) : windows.data(), jobs,
              (device ? cos.device_view : cos.host_view).as<const float>(),
              (device ? sin.device_view : sin.host_view).as<const float>(), entries);
    }
  }
  for (int l = 4; l < kLayers; ++l) EXPECT_LT(cache_error(l), kF32Products) << "entry layer " << l;

  // The indexer over the CSA entries' keys: the same chosen set per row.
  const int heads = 2, k = 5;
  Both queries = random({tokens, heads, key_width}), weights = random({tokens, heads});
  std::vector<int32_t> cpu_selected(static_cast<size_t>(tokens * k));
  BackendMemory gpu_selected = gpu_->allocate(cpu_selected.size() * 4);
  EntryStripes cpu_entries{records(false, 4, 0), 6, 4}, gpu_entries{records(true, 4, 0), 6, 4};
  cpu_->index_select(queries.host_view, weights.host_view, 0.3f, batch_->host, cpu_entries,
                     csa_width, k, cpu_selected.data());
  gpu_->index_select(queries.device_view, weights.device_view, 0.3f, batch_->device, gpu_entries,
                     csa_width, k, static_cast<int32_t*>(gpu_selected.get()));
  std::vector<int32_t> got(cpu_selected.size());
  gpu_->to_host(got.data(), gpu_selected.get(), got.size() * 4);
  for (int64_t t = 0; t < tokens; ++t) {
    std::multiset<int32_t> want(cpu_selected.begin() + t * k, cpu_selected.begin() + (t + 1) * k);
    std::multiset<int32_t> have(got.begin() + t * k, got.begin() + (t + 1) * k);
    EXPECT_EQ(have, want) << "row " << t;
  }

  // Attention: window rows (window 7) in a cache of their own, the CSA entries the CPU chose,
  // then the HCA-style ones, every causal entry.
  const int attention_heads = 3;
  KvCacheShape window_shape{1, 1, csa_width, csa_width, kBlock, true, {}, DType::kF32};
  KvCache cpu_window(window_shape, kPool), gpu_window(window_shape, kPool, *gpu_);
  Both rows = random({tokens, 1, csa_width});
  cpu_->kv_write(rows.host_view, nullptr, batch_->host, cpu_window.layer(0));
  gpu_->kv_write(rows.device_view, nullptr, batch_->device, gpu_window.layer(0));
  Both q = random({tokens, attention_heads, csa_width}), sinks = random({attention_heads});
  BackendMemory chosen = gpu_->allocate(cpu_selected.size() * 4);
  gpu_->to_backend(chosen.get(), cpu_selected.data(), cpu_selected.size() * 4);
  for (bool sparse : {true, false}) {
    Both out = output({tokens, attention_heads, csa_width});
    cpu_->sparse_attention(q.host_view, batch_->host, cpu_window.layer(0), 7,
                           sparse ? cpu_entries : EntryStripes{records(false, 4, 6), 3, 8},
                           sparse ? cpu_selected.data() : nullptr, k, sinks.host_view, 0.25f,
                           out.host_view);
    gpu_->sparse_attention(q.device_view, batch_->device, gpu_window.layer(0), 7,
                           sparse ? gpu_entries : EntryStripes{records(true, 4, 6), 3, 8},
                           sparse ? static_cast<const int32_t*>(chosen.get()) : nullptr, k,
                           sinks.device_view, 0.25f, out.device_view);
    EXPECT_LT(error(out), kF32Products) << (sparse ? "chosen entries" : "every entry");
  }
}

// Prompt rows (343 of them) on the tensor cores: 10 heads of 64 with entries in stripes of 16;
// V4-Flash's 64 heads of 512 and 6 more (a second, mostly empty group of heads), a window of
// 100 (keys over several tiles of 64); 96 dims (below the accumulators' 128) with stripes of 2
// floats, read one by one; the V4 fixture's 4 heads of 32.
TEST_F(CudaV4Records, PromptAttentionOnTensorCoresMatchesTheCpu) {
  const AttentionShape shapes[] = {{10, 64, 4}, {70, 512, 16}, {3, 96, 48}, {4, 32, 2}};
  for (const AttentionShape& shape : shapes) {
    SCOPED_TRACE(::testing::Message() << shape.heads << " heads of " << shape.dim);
    ASSERT_TRUE(sparse_attention_on_tensor_cores(343, shape.heads, shape.dim));
    const int k = 6;
    expect_attention_matches(*batch_, 9, random_choices(*batch_, k, shape.rate), k, shape);
    expect_attention_matches(*batch_, 100, random_choices(*batch_, k, shape.rate), k, shape);
  }
}

// The indexer's scores of prompt rows on the tensor cores round queries and keys to bf16, so a
// row may swap near-tied entries: every entry the GPU chooses must score, in f32 on the host,
// within a bf16 margin of the row's k-th best, and a row chooses as many as it can see. Shapes:
// V4-Flash's 64 heads of 128 (keys at the start of 32-float stripes, read 16 bytes at a time);
// 40 heads (a part-filled last tile) of 64 behind 16 other floats in stripes of 10, read one by
// one.
TEST_F(CudaV4Records, PromptIndexerOnTensorCoresChoosesTheBestEntries) {
  struct Shape {
    int heads, dim, rate;
    int64_t key_offset;
  };
  const int64_t tokens = 343;
  const int k = 6;
  for (const Shape& shape : {Shape{64, 128, 4, 0}, Shape{40, 64, 8, 16}}) {
    SCOPED_TRACE(::testing::Message() << shape.heads << " heads of " << shape.dim);
    ASSERT_TRUE(index_scores_on_tensor_cores(tokens, shape.heads, shape.dim));
    const int64_t stripe = (shape.key_offset + shape.dim + shape.rate - 1) / shape.rate;
    ASSERT_LE(stripe, kRow);
    Both stripes = random({tokens, stripe});
    gpu_->write_records(stripes.device_view, batch_->device, records(true, 0, 0));
    Both queries = random({tokens, shape.heads, shape.dim});
    Both weights = random({tokens, shape.heads});
    BackendMemory selected = gpu_->allocate(static_cast<size_t>(tokens * k) * 4);
    gpu_->index_select(queries.device_view, weights.device_view, 0.3f, batch_->device,
                       EntryStripes{records(true, 0, 0), stripe, shape.rate}, shape.key_offset, k,
                       static_cast<int32_t*>(selected.get()));
    std::vector<int32_t> got(static_cast<size_t>(tokens * k));
    gpu_->to_host(got.data(), selected.get(), got.size() * 4);
    const std::vector<float> stored = host_floats(stripes), q = host_floats(queries),
                             w = host_floats(weights);
    for (size_t seq = 0; seq < 2; ++seq) {
      const int32_t start = batch_->query_start[seq];
      for (int32_t position = 0; position < batch_->context_lens[seq]; ++position) {
        const int64_t t = start + position, visible = (position + 1) / shape.rate;
        std::vector<float> truth(static_cast<size_t>(visible));
        for (int64_t e = 0; e < visible; ++e) {
          double score = 0;
          for (int h = 0; h < shape.heads; ++h) {
            double dot = 0;
            for (int c = 0; c < shape.dim; ++c) {
              const int64_t element = shape.key_offset + c;
              const int64_t row = start + e * shape.rate + element / stripe;
              dot += double(q[static_cast<size_t>((t * shape.heads + h) * shape.dim + c)]) *
                     stored[static_cast<size_t>(row * stripe + element % stripe)];
            }
            score += w[static_cast<size_t>(t * shape.heads + h)] * std::max(dot, 0.0);
          }
          truth[static_cast<size_t>(e)] = static_cast<float>(0.3 * score);
        }
        std::vector<float> ranked = truth;
        std::sort(ranked.begin(), ranked.end(), std::greater<>());
        const auto wanted = static_cast<size_t>(std::min<int64_t>(k, visible));
        float margin = 0.0f;
        for (float v : truth) margin = std::max(margin, 2e-2f * std::abs(v));
        std::set<int32_t> chosen;
        for (int i = 0; i < k; ++i) {
          const int32_t e = got[static_cast<size_t>(t * k + i)];
          if (e < 0) continue;
          ASSERT_LT(e, visible) << "row " << t;
          EXPECT_GE(truth[static_cast<size_t>(e)], ranked[wanted - 1] - margin) << "row " << t;
          chosen.insert(e);
        }
        EXPECT_EQ(chosen.size(), wanted) << "row " << t;
      }
    }
  }
}

// 100 rows of 10 heads: too few for the tensor cores, enough for the tiled f32 kernel unsplit.
TEST_F(CudaV4Records, TiledAttentionMatchesTheCpu) {
  auto rows = paged_batch({0, 20, 100}, {43, 300}, kBlock, kMaxBlocks);
  ASSERT_FALSE(sparse_attention_on_tensor_cores(100, 10, 64));
  EXPECT_TRUE(sparse_attention_on_tensor_cores(32, 64, 512));  // a decode batch of V4's heads
  EXPECT_FALSE(sparse_attention_on_tensor_cores(31, 64, 512));
  EXPECT_EQ(sparse_attention_workspace_floats(100, 10, 64, 9 + 6), 0);
  expect_attention_matches(*rows, 9, random_choices(*rows, 6, 4), 6, {});
}

// Decode rows (one query per sequence, at positions 42 and 299) give the tiled kernel too few
// blocks, so their keys are split and the splits' states combined with the sinks: the short
// sequence's keys leave some splits empty.
TEST_F(CudaV4Records, DecodeRowsSplitTheirKeys) {
  auto decode = paged_batch({0, 1, 2}, {43, 300}, kBlock, kMaxBlocks);
  expect_attention_matches(*decode, 40, {0, 9, -1, 3, 9, 1, 74, 0, 50, -1, 12, 33}, 6, {});
  EXPECT_GT(sparse_attention_workspace_floats(2, 10, 64, 40 + 300 / 4), 0);
}

}  // namespace
}  // namespace deepinfer::cuda

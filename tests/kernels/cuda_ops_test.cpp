// The CUDA backend against the CPU backend through the Ops interface, op by op, on fresh
// random inputs: what the model code sees. Tolerances (relative L2 norm of the difference):
// f32 elementwise work and row movement 1e-6; products that keep activations in f32 (decode
// rows, the tiled fallback, per-head products) 1e-5, only the summation order differs;
// prompt products through cuBLASLt, which rounds activations to bf16 (or f16 for f16
// weights), 1e-2.
#include "kernels/cuda/cuda_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <random>
#include <utility>

#include "core/dtype.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda_parity.h"
#include "kernels/ops.h"
#include "kv/kv_cache.h"

namespace deepinfer::cuda {
namespace {

using testing::bf16_weight_products;
using testing::Both;
using testing::CudaOpsParity;
using testing::kBf16Activations;
using testing::kExact;
using testing::kF32Products;
using testing::kFp8Activations;
using testing::kHalfActivations;

// Every weight dtype at decode and prompt row counts, with a bias.
TEST_F(CudaOpsParity, MatmulEveryDtypeAndRowCount) {
  const int64_t n = 384, k = 512;
  struct Case {
    DType dtype;
    int64_t rows;
    double tolerance;
  };
  for (Case c :
       {Case{DType::kBF16, 1, kF32Products}, Case{DType::kBF16, 3, kF32Products},
        Case{DType::kBF16, 8, kBf16Activations}, Case{DType::kBF16, 37, kBf16Activations},
        Case{DType::kF32, 3, kF32Products}, Case{DType::kF32, 37, kF32Products},
        Case{DType::kF16, 3, kF32Products}, Case{DType::kF16, 19, kHalfActivations},
        Case{DType::kF8E4M3, 5, kF32Products}, Case{DType::kF8E4M3, 40, kFp8Activations}}) {
    Both x = random({c.rows, k});
    Both w = random({n, k}, c.dtype, 0.05f);
    if (c.dtype == DType::kF8E4M3) attach_scales(w, n, k);
    Both bias = random({n}, DType::kBF16);
    Both y = output({c.rows, n});
    cpu_->matmul(x.host_view, w.host_view, &bias.host_view, y.host_view);
    gpu_->matmul(x.device_view, w.device_view, &bias.device_view, y.device_view);
    EXPECT_LT(error(y), c.tolerance) << dtype_name(c.dtype) << " with " << c.rows << " rows";
  }
  // Products wider than a few thousand columns, as lm_head and gate/up are.
  for (DType dtype : {DType::kBF16, DType::kF8E4M3}) {
    const int64_t wide = 9000;
    Both x = random({3, k}), w = random({wide, k}, dtype, 0.05f), y = output({3, wide});
    if (dtype == DType::kF8E4M3) attach_scales(w, wide, k);
    cpu_->matmul(x.host_view, w.host_view, nullptr, y.host_view);
    gpu_->matmul(x.device_view, w.device_view, nullptr, y.device_view);
    EXPECT_LT(error(y), kF32Products) << dtype_name(dtype) << ", " << wide << " columns";
  }
}

// q/k/v-like jobs of one x in one launch, with a bias on one of them, beside a job that
// reads its own input (which runs alone).
TEST_F(CudaOpsParity, GroupedDecodeProducts) {
  const int64_t k = 256;
  for (int64_t rows : {1, 3, 8}) {
    Both x = random({rows, k}), own = random({rows, k});
    Both wq = random({320, k}, DType::kBF16, 0.05f), wk = random({64, k}, DType::kBF16, 0.05f);
    Both wv = random({64, k}, DType::kBF16, 0.05f), wo = random({96, k}, DType::kBF16, 0.05f);
    Both bias = random({64}, DType::kF32);
    Both q = output({rows, 320}), kk = output({rows, 64}), v = output({rows, 64});
    Both o = output({rows, 96});
    auto jobs = [&](bool device) {
      auto pick = [device](Both& both) { return device ? &both.device_view : &both.host_view; };
      return std::vector<MatmulJob>{{pick(wq), nullptr, pick(q)},
                                    {pick(wk), pick(bias), pick(kk)},
                                    {pick(wo), nullptr, pick(o), pick(own)},
                                    {pick(wv), nullptr, pick(v)}};
    };
    cpu_->matmuls(x.host_view, jobs(false));
    gpu_->matmuls(x.device_view, jobs(true));
    for (Both* out : {&q, &kk, &v, &o})
      EXPECT_LT(error(*out), bf16_weight_products(rows)) << rows << " rows";
  }
}

// The fused forms of a block's pre-norm + products and of its residual update at decode row
// counts: normalised and added inside the products' launch while x fits the 64 KB staged in
// shared memory (8 x 2048), the plain ops one after the other beyond (8 x 4096).
TEST_F(CudaOpsParity, NormedProductsAndResidualUpdates) {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 4096}, {3, 2048}, {8, 2048}, {8, 4096}};
  for (auto [rows, k] : shapes) {
    Both x = random({rows, k}), norm = random({k}, DType::kBF16);
    Both wq = random({512, k}, DType::kBF16, 0.05f), wk = random({128, k}, DType::kBF16, 0.05f);
    Both bias = random({128}, DType::kBF16);
    Both q = output({rows, 512}), kk = output({rows, 128}), normed = output({rows, k});
    auto pick = [](Both& both, bool device) {
      return device ? &both.device_view : &both.host_view;
    };
    auto jobs = [&](bool device) {
      return std::vector<MatmulJob>{{pick(wq, device), nullptr, pick(q, device)},
                                    {pick(wk, device), pick(bias, device), pick(kk, device)}};
    };
    cpu_->norm_matmuls(x.host_view, norm.host_view, 1e-5f, normed.host_view, jobs(false));
    gpu_->norm_matmuls(x.device_view, norm.device_view, 1e-5f, normed.device_view, jobs(true));
    EXPECT_LT(error(q), bf16_weight_products(rows)) << rows << " rows";
    EXPECT_LT(error(kk), bf16_weight_products(rows)) << rows << " rows";

    Both residual = random({rows, 512}), scratch = output({rows, 512});
    Both wo = random({512, k}, DType::kBF16, 0.05f), o_bias = random({512}, DType::kBF16);
    cpu_->matmul_add(x.host_view, wo.host_view, &o_bias.host_view, scratch.host_view,
                     residual.host_view);
    gpu_->matmul_add(x.device_view, wo.device_view, &o_bias.device_view, scratch.device_view,
                     residual.device_view);
    EXPECT_LT(error(residual), bf16_weight_products(rows)) << rows << " rows";
  }
}

// The gated MLP's first half at decode: on the GPU one launch (norm, gate and up products,
// silu(g) * u inside) at 1, 3 and 8 rows, the same bits as the GPU's separate norm_matmuls
// and silu_mul, and the CPU's result within the product tolerance; with a bias the plain ops.
TEST_F(CudaOpsParity, GatedProductsMatchTheSeparateOps) {
  const int64_t k = 2048, n = 1000;
  for (int64_t rows : {1, 3, 8}) {
    for (bool with_bias : {false, true}) {
      Both x = random({rows, k}), norm = random({k}, DType::kBF16);
      Both wg = random({n, k}, DType::kBF16, 0.05f), wu = random({n, k}, DType::kBF16, 0.05f);
      Both bias = random({n}, DType::kBF16);
      Both gate = output({rows, n}), up = output({rows, n}), normed = output({rows, k});
      auto job = [&](Both& weight, Both& out, bool device) {
        const Tensor* b = with_bias ? (device ? &bias.device_view : &bias.host_view) : nullptr;
        return device ? MatmulJob{&weight.device_view, b, &out.device_view}
                      : MatmulJob{&weight.host_view, b, &out.host_view};
      };
      cpu_->norm_silu_gate(x.host_view, norm.host_view, 1e-5f, normed.host_view,
                           job(wg, gate, false), job(wu, up, false), gate.host_view);
      gpu_->norm_silu_gate(x.device_view, norm.device_view, 1e-5f, normed.device_view,
                           job(wg, gate, true), job(wu, up, true), gate.device_view);
      EXPECT_LT(error(gate), bf16_weight_products(rows)) << rows << " rows, bias " << with_bias;
      const std::vector<float> fused = device_floats(gate);
      gpu_->norm_matmuls(x.device_view, norm.device_view, 1e-5f, normed.device_view,
                         {job(wg, gate, true), job(wu, up, true)});
      gpu_->silu_mul(gate.device_view, up.device_view, gate.device_view);
      EXPECT_EQ(fused, device_floats(gate)) << rows << " rows, bias " << with_bias;
    }
  }
}

TEST_F(CudaOpsParity, StridedCopy) {
  const int64_t tokens = 3, heads = 4, width = 64, row = 80;
  Both source = random({tokens, width});
  Both target = random({tokens, heads, row});
  auto repeated = [&](Tensor view) {
    return Tensor::strided(view.data, DType::kF32, {tokens, heads, width}, {width, 0, 1},
                           view.device);
  };
  auto slice = [&](Tensor view) {
    return Tensor::strided(view.as<float>() + 8, DType::kF32, {tokens, heads, width},
                           {heads * row, row, 1}, view.device);
  };
  Tensor host_slice = slice(target.host_view), device_slice = slice(target.device_view);
  cpu_->copy(repeated(source.host_view), host_slice);
  gpu_->copy(repeated(source.device_view), device_slice);
  EXPECT_EQ(error(target), 0.0);
}

TEST_F(CudaOpsParity, HeadMatmulBothDirections) {
  const int64_t tokens = 3, heads = 4, k = 64, rows = 32, stride = 48;
  Both w = random({heads * stride, k}, DType::kBF16, 0.1f);
  HeadSlices slices{stride, 16, rows};
  Both x = random({tokens, heads, k}), out = output({tokens, heads, rows});
  cpu_->head_matmul(x.host_view, w.host_view, slices, false, out.host_view);
  gpu_->head_matmul(x.device_view, w.device_view, slices, false, out.device_view);
  EXPECT_LT(error(out), kF32Products);
  Both xt = random({tokens, heads, rows}), outt = output({tokens, heads, k});
  cpu_->head_matmul(xt.host_view, w.host_view, slices, true, outt.host_view);
  gpu_->head_matmul(xt.device_view, w.device_view, slices, true, outt.device_view);
  EXPECT_LT(error(outt), kF32Products);
}

TEST_F(CudaOpsParity, RowMovementAndGatedActivations) {
  const int64_t rows = 6, width = 300;
  Both x = random({rows, width});
  std::vector<int32_t> picks = {4, 0, 4, 2};
  Both gathered = output({4, width});
  cpu_->gather_rows(x.host_view, picks, gathered.host_view);
  gpu_->gather_rows(x.device_view, picks, gathered.device_view);
  EXPECT_LT(error(gathered), kExact);
  Both y = random({rows, width});
  std::vector<float> scales = {0.5f, -1.0f, 2.0f, 0.25f};
  cpu_->add_scaled_rows(y.host_view, picks, scales, gathered.host_view);
  gpu_->add_scaled_rows(y.device_view, picks, scales, gathered.device_view);
  EXPECT_LT(error(y), kExact);
  Both gate = random({rows, width}), up = random({rows, width}), out = output({rows, width});
  cpu_->gelu_tanh_mul(gate.host_view, up.host_view, out.host_view);
  gpu_->gelu_tanh_mul(gate.device_view, up.device_view, out.device_view);
  EXPECT_LT(error(out), kExact);
  Both silu = output({rows, width});
  cpu_->silu_mul(gate.host_view, up.host_view, silu.host_view);
  gpu_->silu_mul(gate.device_view, up.device_view, silu.device_view);
  EXPECT_LT(error(silu), kExact);
}

TEST_F(CudaOpsParity, NormsEmbeddingAndRope) {
  const int64_t tokens = 5, heads = 3, dim = 64, vocab = 50;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    Both table = random({vocab, heads * dim}, dtype);
    std::vector<int32_t> ids = {3, 49, 0, 3, 17};
    BackendMemory device_ids = gpu_->allocate(ids.size() * 4);
    gpu_->to_backend(device_ids.get(), ids.data(), ids.size() * 4);
    Both embedded = output({tokens, heads * dim});
    cpu_->embedding(table.host_view, ids.data(), embedded.host_view);
    gpu_->embedding(table.device_view, static_cast<const int32_t*>(device_ids.get()),
                    embedded.device_view);
    EXPECT_LT(error(embedded), kExact) << dtype_name(dtype);
    Both weight = random({dim}, dtype);
    Both x = random({tokens, heads, dim});
    cpu_->rmsnorm(x.host_view, weight.host_view, 1e-6f, x.host_view);
    gpu_->rmsnorm(x.device_view, weight.device_view, 1e-6f, x.device_view);
    EXPECT_LT(error(x), kExact) << dtype_name(dtype);
  }
  Both x = random({tokens, heads, dim});
  Both cos = random({tokens, dim / 2}), sin = random({tokens, dim / 2});
  for (bool interleaved : {false, true}) {
    cpu_->rope(x.host_view, cos.host_view.as<const float>(), sin.host_view.as<const float>(), dim,
               interleaved);
    gpu_->rope(x.device_view, cos.device_view.as<const float>(), sin.device_view.as<const float>(),
               dim, interleaved);
    EXPECT_LT(error(x), kExact) << "interleaved " << interleaved;
  }
}

// Rotation of q and k fused with the cache write (full and partial rotary dims), against
// rope, rope and kv_write on the CPU: q, k and every slot of an f32 cache.
TEST_F(CudaOpsParity, RopeFusedWithTheKvWrite) {
  const int64_t tokens = 5, heads = 8, kv_heads = 2, dim = 64, slots = 64;
  std::vector<int64_t> slot_of = {3, 17, 40, 41, 63};
  BackendMemory device_slots;
  const void* slot_mapping = backend_copy(*gpu_, slot_of.data(), slot_of.size() * 8, device_slots);
  for (int rotary : {64, 32}) {
    Both q = random({tokens, heads, dim}), k = random({tokens, kv_heads, dim});
    Both v = random({tokens, kv_heads, dim});
    Both cos = random({tokens, rotary / 2}), sin = random({tokens, rotary / 2});
    Both keys = random({slots, kv_heads * dim}), values = random({slots, kv_heads * dim});
    auto run = [&](Ops& ops, bool device, const int64_t* mapping) {
      auto view = [device](Both& both) -> Tensor& {
        return device ? both.device_view : both.host_view;
      };
      AttentionBatch batch;
      batch.slot_mapping = mapping;
      PagedKvView cache{
          view(keys).data,       view(values).data,     16,    static_cast<int>(kv_heads),
          static_cast<int>(dim), static_cast<int>(dim), false, DType::kF32};
      ops.rope_kv_write(view(q), view(k), view(v), view(cos).as<const float>(),
                        view(sin).as<const float>(), rotary, batch, cache);
    };
    run(*cpu_, false, slot_of.data());
    run(*gpu_, true, static_cast<const int64_t*>(slot_mapping));
    for (Both* out : {&q, &k, &keys, &values}) EXPECT_LT(error(*out), kExact) << rotary;
  }
}

// The attention block's input half at decode: on the GPU one launch (norm, q/k/v products,
// rope, the cache write) at 1 and 5 rows with full and partial rotary dims: the same bits as
// the GPU's norm_matmuls then rope_kv_write, and the CPU's within the product tolerance.
TEST_F(CudaOpsParity, QkvProductsRopeAndCacheWriteInOneLaunch) {
  const int64_t heads = 8, kv_heads = 2, dim = 64, hidden = 512, slots = 64;
  const std::vector<int64_t> slot_of = {3, 17, 40, 41, 63};
  BackendMemory device_slots;
  const void* slot_mapping = backend_copy(*gpu_, slot_of.data(), slot_of.size() * 8, device_slots);
  for (int64_t tokens : {1, 5}) {
    for (int rotary : {64, 32}) {
      Both x = random({tokens, hidden}), norm = random({hidden}, DType::kBF16);
      Both wq = random({heads * dim, hidden}, DType::kBF16, 0.05f);
      Both wk = random({kv_heads * dim, hidden}, DType::kBF16, 0.05f);
      Both wv = random({kv_heads * dim, hidden}, DType::kBF16, 0.05f);
      Both cos = random({tokens, rotary / 2}), sin = random({tokens, rotary / 2});
      Both normed = output({tokens, hidden});
      Both start_keys = random({slots, kv_heads * dim}),
           start_values = random({slots, kv_heads * dim});
      // Runs the ops into fresh outputs and a copy of the starting cache; the results in order
      // q, k, v, keys, values.
      auto run = [&](Ops& ops, bool device, bool fused) {
        std::vector<Both> out;
        out.push_back(output({tokens, heads * dim}));
        out.push_back(output({tokens, kv_heads * dim}));
        out.push_back(output({tokens, kv_heads * dim}));
        out.push_back(make(host_floats(start_keys), DType::kF32, {slots, kv_heads * dim}));
        out.push_back(make(host_floats(start_values), DType::kF32, {slots, kv_heads * dim}));
        auto view = [device](Both& both) -> Tensor& {
          return device ? both.device_view : both.host_view;
        };
        const Device where = device ? Device::kCuda : Device::kCpu;
        Tensor q_heads =
            Tensor::contiguous(view(out[0]).data, DType::kF32, {tokens, heads, dim}, where);
        Tensor k_heads =
            Tensor::contiguous(view(out[1]).data, DType::kF32, {tokens, kv_heads, dim}, where);
        Tensor v_heads =
            Tensor::contiguous(view(out[2]).data, DType::kF32, {tokens, kv_heads, dim}, where);
        AttentionBatch batch;
        batch.slot_mapping = device ? static_cast<const int64_t*>(slot_mapping) : slot_of.data();
        PagedKvView cache{
            view(out[3]).data,     view(out[4]).data,     16,    static_cast<int>(kv_heads),
            static_cast<int>(dim), static_cast<int>(dim), false, DType::kF32};
        const std::vector<MatmulJob> jobs = {{&view(wq), nullptr, &view(out[0])},
                                             {&view(wk), nullptr, &view(out[1])},
                                             {&view(wv), nullptr, &view(out[2])}};
        const float* c = view(cos).as<const float>();
        const float* s = view(sin).as<const float>();
        if (fused) {
          ops.norm_qkv_rope_write(view(x), view(norm), 1e-5f, view(normed), jobs, q_heads, k_heads,
                                  v_heads, c, s, rotary, batch, cache);
        } else {
          ops.norm_matmuls(view(x), view(norm), 1e-5f, view(normed), jobs);
          ops.rope_kv_write(q_heads, k_heads, v_heads, c, s, rotary, batch, cache);
        }
        return out;
      };
      std::vector<Both> want = run(*cpu_, false, false), fused = run(*gpu_, true, true),
                        separate = run(*gpu_, true, false);
      const int default_uses = cuda::row_stream();
      cuda::set_row_stream(cuda::kStreamQkvRope);  // one row: weights through shared memory
      std::vector<Both> streamed = run(*gpu_, true, true);
      cuda::set_row_stream(default_uses);
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(device_floats(streamed[i]), device_floats(separate[i]))
            << tokens << " tokens, rotary " << rotary << ", output " << i << " (row stream)";
        const std::vector<float> got = device_floats(fused[i]);
        std::vector<float> expected = host_floats(want[i]);
        double diff = 0, total = 0;
        for (size_t e = 0; e < got.size(); ++e) {
          diff += (double(got[e]) - expected[e]) * (double(got[e]) - expected[e]);
          total += double(expected[e]) * expected[e];
        }
        EXPECT_LT(std::sqrt(diff / total), bf16_weight_products(tokens))
            << tokens << " tokens, rotary " << rotary << ", output " << i;
        EXPECT_EQ(got, device_floats(separate[i]))
            << tokens << " tokens, rotary " << rotary << ", output " << i;
      }
    }
  }
}

// MLA normalises and rotates slices of wider rows in place: row strides and head strides.
TEST_F(CudaOpsParity, NormAndRopeOnSlicesOfWiderRows) {
  const int64_t tokens = 5, heads = 3, dim = 64, part = 32;
  Both weight = random({part}, DType::kBF16);
  Both rows = random({tokens, heads * dim});
  Both cos = random({tokens, part / 2}), sin = random({tokens, part / 2});
  auto slice = [&](const Tensor& whole, int64_t offset, std::initializer_list<int64_t> shape,
                   std::initializer_list<int64_t> strides) {
    return Tensor::strided(whole.as<float>() + offset, DType::kF32, shape, strides, whole.device);
  };
  Tensor host_norm = slice(rows.host_view, dim, {tokens, part}, {heads * dim, 1});
  Tensor device_norm = slice(rows.device_view, dim, {tokens, part}, {heads * dim, 1});
  cpu_->rmsnorm(host_norm, weight.host_view, 1e-6f, host_norm);
  gpu_->rmsnorm(device_norm, weight.device_view, 1e-6f, device_norm);
  EXPECT_LT(error(rows), kExact);
  Tensor host_rope = slice(rows.host_view, part, {tokens, heads, part}, {heads * dim, dim, 1});
  Tensor device_rope = slice(rows.device_view, part, {tokens, heads, part}, {heads * dim, dim, 1});
  cpu_->rope(host_rope, cos.host_view.as<const float>(), sin.host_view.as<const float>(), part,
             true);
  gpu_->rope(device_rope, cos.device_view.as<const float>(), sin.device_view.as<const float>(),
             part, true);
  EXPECT_LT(error(rows), kExact);
}

// Every sampling mode over a Llama-3-sized vocabulary (rows 16-byte aligned: the greedy max
// reads four logits a load) and an odd one (rows unaligned: one a load), and a row of heavily
// tied logits: the same token as the host reference (integer masses make the sums
// order-free), logprobs to float rounding.
class CudaSamplingParity : public CudaOpsParity, public ::testing::WithParamInterface<int64_t> {};

TEST_P(CudaSamplingParity, SamplingDrawsTheReferenceToken) {
  const int64_t vocab = GetParam(), rows = 3;
  std::vector<float> values(static_cast<size_t>(rows * vocab));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& v : values) v = normal(rng_);
  for (int64_t i = 0; i < vocab; ++i)  // row 2: eight distinct values, each thousands of times
    values[static_cast<size_t>(2 * vocab + i)] = static_cast<float>((i * 7919) % 8) * 0.5f;
  Both logits = make(values, DType::kF32, {rows, vocab});
  struct Mode {
    float temperature;
    int32_t top_k;
    float top_p, min_p;
  };
  const Mode modes[] = {
      {0.0f, 0, 1.0f, 0.0f}, {1.0f, 0, 1.0f, 0.0f},    {0.7f, 50, 1.0f, 0.0f},
      {1.0f, 0, 0.9f, 0.0f}, {1.3f, 0, 1.0f, 0.05f},   {0.8f, 40, 0.8f, 0.1f},
      {1.0f, 1, 1.0f, 0.0f}, {2.0f, 1000, 0.5f, 0.0f}, {1.0f, 200000, 0.99f, 0.0f}};
  std::vector<TokenDraw> draws;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (const Mode& mode : modes) {
    for (int64_t row = 0; row < rows; ++row) {
      for (int repeat = 0; repeat < 4; ++repeat)  // every other draw without its logprob
        draws.push_back({row, mode.temperature, mode.top_k, mode.top_p, mode.min_p, uniform(rng_),
                         repeat % 2 == 0});
    }
  }
  std::vector<DrawnToken> want(draws.size()), got(draws.size());
  cpu_->sample_rows(logits.host_view, draws, want.data());
  gpu_->sample_rows(logits.device_view, draws, got.data());
  for (size_t i = 0; i < draws.size(); ++i) {
    EXPECT_EQ(got[i].token, want[i].token)
        << "row " << draws[i].row << " temperature " << draws[i].temperature << " top_k "
        << draws[i].top_k << " top_p " << draws[i].top_p << " min_p " << draws[i].min_p
        << " uniform " << draws[i].uniform;
    EXPECT_NEAR(got[i].logprob, want[i].logprob, 1e-4) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, CudaSamplingParity, ::testing::Values(128256, 50001));

// A model vocabulary padded past what the tokenizer can decode (Qwen3: 151,936 rows of the
// output matrix, 151,669 tokens) is sampled through a view of the first `limit` columns: the
// padded ids are never drawn, even where their logits are the largest, and every draw equals
// the host's over the same view.
TEST_F(CudaOpsParity, SamplingStaysInsideTheVocabularyLimit) {
  const int64_t width = 151936, limit = 151669, rows = 2;
  std::vector<float> values(static_cast<size_t>(rows * width));
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& v : values) v = normal(rng_);
  for (int64_t row = 0; row < rows; ++row)  // the padding holds the largest logits
    for (int64_t i = limit; i < width; ++i) values[static_cast<size_t>(row * width + i)] = 50.0f;
  Both logits = make(values, DType::kF32, {rows, width});
  Tensor host = Tensor::strided(logits.host_view.data, DType::kF32, {rows, limit}, {width, 1});
  Tensor device = Tensor::strided(logits.device_view.data, DType::kF32, {rows, limit}, {width, 1},
                                  logits.device_view.device);
  std::vector<TokenDraw> draws;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int64_t row = 0; row < rows; ++row) {
    draws.push_back({row, 0.0f, 0, 1.0f, 0.0f, uniform(rng_), true});
    draws.push_back({row, 1.0f, 0, 1.0f, 0.0f, uniform(rng_), true});
    draws.push_back({row, 0.8f, 40, 0.9f, 0.05f, uniform(rng_), false});
  }
  std::vector<DrawnToken> want(draws.size()), got(draws.size());
  cpu_->sample_rows(host, draws, want.data());
  gpu_->sample_rows(device, draws, got.data());
  for (size_t i = 0; i < draws.size(); ++i) {
    EXPECT_LT(got[i].token, limit) << i;
    EXPECT_EQ(got[i].token, want[i].token) << i;
    EXPECT_NEAR(got[i].logprob, want[i].logprob, 1e-4) << i;
  }
}

// A grammar's masks applied where the logits are: rows of a padded vocabulary seen through
// the sampled columns, one mask covering fewer ids than the view (the rest banned), one row
// not masked at all. The same logits as the host's ban, bit for bit, and the same draws,
// every one an allowed token.
TEST_F(CudaOpsParity, GrammarMasksBanTheSameTokensAsTheHost) {
  const int64_t width = 151936, limit = 151669, rows = 4;
  Both logits = random({rows, width}, DType::kF32, 2.0f);
  Tensor host = Tensor::strided(logits.host_view.data, DType::kF32, {rows, limit}, {width, 1});
  Tensor device = Tensor::strided(logits.device_view.data, DType::kF32, {rows, limit}, {width, 1},
                                  logits.device_view.device);
  const size_t words = static_cast<size_t>(limit + 63) / 64;
  std::vector<std::vector<uint64_t>> bits(3, std::vector<uint64_t>(words, 0));
  std::uniform_int_distribution<int64_t> id(0, limit - 1);
  for (auto& row : bits)
    for (int i = 0; i < 300; ++i) {
      const int64_t token = id(rng_);
      row[static_cast<size_t>(token / 64)] |= uint64_t{1} << (token % 64);
    }
  std::fill(bits[2].begin(), bits[2].begin() + 40, ~uint64_t{0});  // whole words kept
  const std::vector<RowMask> masks = {{0, bits[0].data(), static_cast<int32_t>(limit)},
                                      {2, bits[1].data(), 150000},
                                      {3, bits[2].data(), static_cast<int32_t>(limit)}};
  cpu_->mask_rows(host, masks);
  gpu_->mask_rows(device, masks);
  const std::vector<float> want = host_floats(logits), got = device_floats(logits);
  ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
  std::vector<TokenDraw> draws;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int64_t row = 0; row < rows; ++row) {
    draws.push_back({row, 0.0f, 0, 1.0f, 0.0f, uniform(rng_), false});
    draws.push_back({row, 0.9f, 0, 0.95f, 0.0f, uniform(rng_), false});
  }
  std::vector<DrawnToken> want_tokens(draws.size()), got_tokens(draws.size());
  cpu_->sample_rows(host, draws, want_tokens.data());
  gpu_->sample_rows(device, draws, got_tokens.data());
  for (size_t i = 0; i < draws.size(); ++i) {
    EXPECT_EQ(got_tokens[i].token, want_tokens[i].token) << i;
    EXPECT_TRUE(
        std::isfinite(want[static_cast<size_t>(draws[i].row * width + got_tokens[i].token)]))
        << i;
  }
}

// V3's noaux_tc (sigmoid, biased top-two group sums), V2's group-limited greedy and plain
// softmax top-k: the same experts; weights within the exp's last-bit differences.
TEST_F(CudaOpsParity, RoutingMatchesTheCpu) {
  struct Case {
    int experts, per_token, groups, topk_groups;
    ExpertRouting::Scoring scoring;
    ExpertRouting::GroupRanking ranking;
    bool bias, normalize;
    bool hashed = false;
  };
  using S = ExpertRouting::Scoring;
  using G = ExpertRouting::GroupRanking;
  for (const Case& c : {Case{16, 4, 4, 2, S::kSigmoid, G::kTopTwoSum, true, true},
                        Case{256, 8, 8, 4, S::kSigmoid, G::kTopTwoSum, true, true},
                        Case{160, 6, 8, 3, S::kSoftmax, G::kBestExpert, false, false},
                        Case{64, 6, 1, 1, S::kSoftmax, G::kNone, false, true},
                        Case{256, 6, 1, 1, S::kSqrtSoftplus, G::kNone, true, true},
                        Case{64, 6, 1, 1, S::kSqrtSoftplus, G::kNone, false, true, true}}) {
    SCOPED_TRACE(c.experts);
    const int64_t tokens = 37;
    ExpertRouting routing;
    routing.num_experts = c.experts;
    routing.experts_per_token = c.per_token;
    routing.scoring = c.scoring;
    routing.group_ranking = c.ranking;
    routing.num_groups = c.groups;
    routing.topk_groups = c.topk_groups;
    routing.normalize = c.normalize;
    routing.scaling = 2.5f;
    Both logits = random({tokens, routing.num_experts});
    std::vector<float> bias;
    std::normal_distribution<float> normal(0.0f, 0.1f);
    for (int e = 0; c.bias && e < c.experts; ++e) bias.push_back(normal(rng_));
    const auto entries = static_cast<size_t>(tokens * c.per_token);
    std::vector<int32_t> cpu_experts(entries), gpu_experts(entries);
    std::vector<float> cpu_weights(entries), gpu_weights(entries);
    std::vector<int32_t> fixed;  // hash routing: given experts, weighted by their scores
    for (int64_t i = 0; c.hashed && i < tokens * c.per_token; ++i)
      fixed.push_back(static_cast<int32_t>((i * 7 + i / c.per_token) % c.experts));
    cpu_->route_experts(logits.host_view, bias, routing, fixed, cpu_experts.data(),
                        cpu_weights.data());
    gpu_->route_experts(logits.device_view, bias, routing, fixed, gpu_experts.data(),
                        gpu_weights.data());
    EXPECT_EQ(gpu_experts, cpu_experts);
    for (size_t i = 0; i < entries; ++i)
      EXPECT_NEAR(gpu_weights[i], cpu_weights[i], 1e-6f * std::abs(cpu_weights[i])) << i;
  }
}

// The routed half of an MoE layer, bf16 and FP8 experts: decode batches (routed, grouped and
// run on the GPU) against the CPU's host grouping, adding into an existing output. 64 tokens
// give every expert more than the eight rows one work item takes. Also DeepSeek-V4's experts
// (sqrt-softplus scores, hash-routed tokens, the SwiGLU clamp) and a width of 136, which the
// device path's chunks do not divide (the general path takes it). FP8 experts of widths 128
// and 256 take the tensor-core decode path and the grouped FP8 prompt path.
struct RoutedCase {
  int64_t inter;
  DType dtype;
  bool v4;
};

class CudaRoutedExperts : public CudaOpsParity, public ::testing::WithParamInterface<RoutedCase> {};

TEST_P(CudaRoutedExperts, MatchTheCpu) {
  const int experts = 16, per_token = 4;
  const int64_t hidden = 256, inter = GetParam().inter;
  for (DType dtype : {GetParam().dtype}) {
    std::deque<Both> weights;
    RoutedExperts host, device;
    for (auto* side : {&host, &device}) {
      side->routing.num_experts = experts;
      side->routing.experts_per_token = per_token;
      side->routing.normalize = true;
      if (GetParam().v4) {
        side->routing.scoring = ExpertRouting::Scoring::kSqrtSoftplus;
        side->routing.swiglu_limit = 0.5f;  // low enough that the random products reach it
      }
    }
    const float scale = dtype == DType::kBF16 ? 0.05f : 1.0f;
    auto add = [&](std::vector<const Tensor*>& on_host, std::vector<const Tensor*>& on_device,
                   int64_t n, int64_t k) {
      Both& w = weights.emplace_back(random({n, k}, dtype, scale));
      if (dtype == DType::kF8E4M3) attach_scales(w, n, k);
      on_host.push_back(&w.host_view);
      on_device.push_back(&w.device_view);
    };
    for (int e = 0; e < experts; ++e) {
      add(host.gate, device.gate, inter, hidden);
      add(host.up, device.up, inter, hidden);
      add(host.down, device.down, hidden, inter);
    }
    // 1,100 tokens (4,400 pairs) pass the device path's bound: a prompt's host grouping, FP8
    // experts sharing one quantisation of x and one of the activations where widths allow.
    for (int64_t tokens : {1, 6, 64, 1100}) {
      SCOPED_TRACE(tokens);
      const bool prompt = tokens * per_token > kMaxRoutedPairs;
      Both x = random({tokens, hidden}), logits = random({tokens, experts});
      Both out = random({tokens, hidden});
      // Hash routing (V4): each token id's experts from a table, looked up on the device.
      const int vocab = 40;
      std::vector<int32_t> ids;
      for (int64_t t = 0; t < tokens; ++t) ids.push_back(static_cast<int32_t>((t * 7 + 3) % vocab));
      host.token_experts.clear();
      for (int64_t i = 0; GetParam().v4 && i < vocab * per_token; ++i)
        host.token_experts.push_back(static_cast<int32_t>((i * 5 + i / per_token) % experts));
      device.token_experts = host.token_experts;
      BackendMemory device_ids = gpu_->allocate(ids.size() * sizeof(int32_t));
      gpu_->to_backend(device_ids.get(), ids.data(), ids.size() * sizeof(int32_t));
      cpu_->routed_experts(x.host_view, logits.host_view, host, ids.data(), out.host_view);
      gpu_->routed_experts(x.device_view, logits.device_view, device,
                           static_cast<const int32_t*>(device_ids.get()), out.device_view);
      // Prompt products on cuBLASLt round x: to bf16, or to e4m3 for FP8 widths it takes.
      // Decode batches of FP8 experts in whole scale blocks run on the tensor cores with x
      // and the activations in e4m3.
      const bool fp8 = dtype == DType::kF8E4M3;
      const bool rounded = prompt ? dtype == DType::kBF16 || (fp8 && inter % 16 == 0)
                                  : fp8 && inter % 128 == 0 && hidden % 128 == 0;
      const double bound =
          rounded ? (dtype == DType::kBF16 ? kBf16Activations : kFp8Activations) : kF32Products;
      EXPECT_LT(error(out), bound);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Widths, CudaRoutedExperts,
    ::testing::Values(RoutedCase{160, DType::kBF16, false}, RoutedCase{160, DType::kF8E4M3, false},
                      RoutedCase{160, DType::kBF16, true}, RoutedCase{136, DType::kBF16, true},
                      RoutedCase{136, DType::kF8E4M3, false}, RoutedCase{256, DType::kF8E4M3, true},
                      RoutedCase{128, DType::kF8E4M3, false}));

// Prompt batches take the tensor-core kernel: a 100-token chunk over 40 cached tokens and a
// whole 70-token prompt, for MHA, GQA groups of 4 and 8, with and without a window.
TEST_F(CudaOpsParity, PromptAttentionOnTheTensorCores) {
  const int dim = 128, block = 16, max_blocks = 9;
  auto batch = paged_batch({0, 100, 170}, {140, 70}, block, max_blocks);
  auto count = static_cast<int64_t>(batch->slots.size());
  const AttentionBatch& host_batch = batch->host;
  const AttentionBatch& device_batch = batch->device;
  for (auto [heads, kv_heads] : {std::pair{4, 4}, std::pair{8, 2}, std::pair{16, 2}}) {
    KvCacheShape shape = KvCacheShape::heads(1, kv_heads, dim, block);
    KvCache cpu_cache(shape, 64);
    shape.dtype = DType::kBF16;  // what the GPU backend keeps
    KvCache gpu_cache(shape, 64, *gpu_);
    Both k = random({count, kv_heads, dim}), v = random({count, kv_heads, dim});
    cpu_->kv_write(k.host_view, &v.host_view, host_batch, cpu_cache.layer(0));
    gpu_->kv_write(k.device_view, &v.device_view, device_batch, gpu_cache.layer(0));
    Both q = random({170, heads, dim});
    for (int window : {0, 33}) {
      Both out = output({170, heads, dim});
      cpu_->paged_attention(q.host_view, host_batch, cpu_cache.layer(0), 0.088f, window,
                            out.host_view);
      gpu_->paged_attention(q.device_view, device_batch, gpu_cache.layer(0), 0.088f, window,
                            out.device_view);
      EXPECT_LT(error(out), kBf16Activations)
          << heads << " heads over " << kv_heads << ", window " << window;
    }
  }
}

// Two sequences (a 3-token prompt chunk over 40 cached tokens, and a 300-token decode) written
// into paged caches on both backends, attended with the split-keys path, and read back; the
// GPU's cache in f32 (same arithmetic as the CPU's) and in bf16 (rounded keys and values).
class CudaKvParity : public CudaOpsParity, public ::testing::WithParamInterface<DType> {};

TEST_P(CudaKvParity, KvWriteAttentionAndReadBack) {
  const int heads = 8, kv_heads = 2, dim = 128, block = 16;
  KvCacheShape shape = KvCacheShape::heads(1, kv_heads, dim, block);
  KvCache cpu_cache(shape, 64);
  shape.dtype = GetParam();
  KvCache gpu_cache(shape, 64, *gpu_);
  double tolerance = GetParam() == DType::kF32 ? kF32Products : kBf16Activations;
  const int max_blocks = 19;
  auto batch = paged_batch({0, 3, 4}, {43, 300}, block, max_blocks);
  auto count = static_cast<int64_t>(batch->slots.size());
  const AttentionBatch& host_batch = batch->host;
  const AttentionBatch& device_batch = batch->device;
  Both k = random({count, kv_heads, dim}), v = random({count, kv_heads, dim});
  cpu_->kv_write(k.host_view, &v.host_view, host_batch, cpu_cache.layer(0));
  gpu_->kv_write(k.device_view, &v.device_view, device_batch, gpu_cache.layer(0));

  Both q = random({4, heads, dim}), out = output({4, heads, dim});
  cpu_->paged_attention(q.host_view, host_batch, cpu_cache.layer(0), 0.088f, 0, out.host_view);
  gpu_->paged_attention(q.device_view, device_batch, gpu_cache.layer(0), 0.088f, 0,
                        out.device_view);
  EXPECT_LT(error(out), tolerance);

  Both keys = output({300, kv_heads * dim});
  cpu_->kv_read_keys(cpu_cache.layer(0), batch->tables.data() + max_blocks, 300, keys.host_view);
  gpu_->kv_read_keys(gpu_cache.layer(0), device_batch.block_tables + max_blocks, 300,
                     keys.device_view);
  EXPECT_LT(error(keys), GetParam() == DType::kF32 ? kExact : kBf16Activations);
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, CudaKvParity, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& dtype_info) {
                           return std::string(dtype_name(dtype_info.param));
                         });

}  // namespace
}  // namespace deepinfer::cuda

// The SIMD kernel tables against the portable reference, and the CPU ops against direct
// formulas (attention over a shuffled paged layout against contiguous attention).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/ops.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using cpu::IsaKernels;
using cpu::WeightType;

std::vector<const IsaKernels*> simd_tables() {
  std::vector<const IsaKernels*> tables;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    tables.push_back(cpu::avx2_kernels());
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
    tables.push_back(cpu::avx512_kernels());
  return tables;
}

std::vector<float> random_values(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<float> values(count);
  for (float& value : values) value = uniform(engine);
  return values;
}

struct Shape {
  int64_t rows, cols, depth;
};

// A weight in every stored type the kernels read, from the same f32 values. FP8 gets block
// scales of `block_rows` x `block_cols` (small, so blocks split rows and vectors).
struct TypedWeights {
  std::vector<float> f32;
  std::vector<uint16_t> bf16, f16;
  std::vector<uint8_t> fp8;
  std::vector<float> fp8_scales;
  std::vector<cpu::WeightMatrix> matrices;

  TypedWeights(int64_t rows, int64_t cols, uint32_t seed, int block_rows, int block_cols)
      : f32(random_values(static_cast<size_t>(rows * cols), seed)) {
    for (float value : f32) {
      bf16.push_back(f32_to_bf16(value));
      f16.push_back(f32_to_f16(value));
    }
    int64_t scale_rows = (rows + block_rows - 1) / block_rows;
    int64_t scale_cols = (cols + block_cols - 1) / block_cols;
    fp8_scales.resize(static_cast<size_t>(scale_rows * scale_cols));
    for (size_t i = 0; i < fp8_scales.size(); ++i)
      fp8_scales[i] = 0.002f * static_cast<float>(i + 1);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        float scale = fp8_scales[static_cast<size_t>(r / block_rows * scale_cols + c / block_cols)];
        fp8.push_back(f32_to_f8e4m3(f32[static_cast<size_t>(r * cols + c)] / scale));
      }
    }
    matrices = {{f32.data(), cols, WeightType::kF32},
                {bf16.data(), cols, WeightType::kBF16},
                {f16.data(), cols, WeightType::kF16},
                {fp8.data(), cols, WeightType::kF8E4M3, fp8_scales.data(), scale_cols, block_rows,
                 block_cols}};
  }
};

// MLA's rearrangements: a per-token vector repeated for every head (source stride 0) into a
// slice of a wider per-head row, and a strided slice copied back out.
TEST(CpuOps, StridedCopyRepeatsAndSlices) {
  auto ops = make_cpu_ops();
  const int64_t tokens = 3, heads = 4, width = 5, row = 8;
  std::vector<float> source(static_cast<size_t>(tokens * width));
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<float>(i);
  std::vector<float> target(static_cast<size_t>(tokens * heads * row), -1.0f);
  Tensor repeated =
      Tensor::strided(source.data(), DType::kF32, {tokens, heads, width}, {width, 0, 1});
  Tensor slice = Tensor::strided(target.data() + 2, DType::kF32, {tokens, heads, width},
                                 {heads * row, row, 1});
  ops->copy(repeated, slice);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t j = 0; j < row; ++j) {
        float want =
            (j >= 2 && j < 2 + width) ? source[static_cast<size_t>(t * width + j - 2)] : -1.0f;
        EXPECT_EQ(target[static_cast<size_t>((t * heads + h) * row + j)], want);
      }
    }
  }
  std::vector<float> back(static_cast<size_t>(tokens * heads * width));
  Tensor back_view = Tensor::contiguous(back.data(), DType::kF32, {tokens, heads, width});
  ops->copy(slice, back_view);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < width; ++j)
        EXPECT_EQ(back[static_cast<size_t>((t * heads + h) * width + j)],
                  source[static_cast<size_t>(t * width + j)]);
  Tensor wrong = Tensor::contiguous(back.data(), DType::kF32, {tokens, width});
  EXPECT_THROW(ops->copy(slice, wrong), Error);
}

// A grammar's masks on rows seen through the sampled columns of wider ones: a token keeps its
// logit exactly when its bit is set and its id is below the mask's `marked`; rows without a
// mask and the columns past the view are untouched.
TEST(CpuOps, MaskRowsBansWhatTheBitsLeaveOut) {
  auto ops = make_cpu_ops();
  const int64_t rows = 3, vocab = 203, width = 210;
  std::vector<float> logits(static_cast<size_t>(rows * width));
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 97) - 40.0f;
  const std::vector<float> before = logits;
  std::vector<uint64_t> bits((vocab + 63) / 64);
  std::mt19937_64 rng(7);
  for (uint64_t& word : bits) word = rng() & rng();
  bits[1] = ~uint64_t{0};
  Tensor view = Tensor::strided(logits.data(), DType::kF32, {rows, vocab}, {width, 1});
  const int32_t marked = 190;
  ops->mask_rows(view, {{0, bits.data(), marked}, {2, bits.data(), static_cast<int32_t>(vocab)}});
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t id = 0; id < width; ++id) {
      const auto at = static_cast<size_t>(row * width + id);
      const bool bit = id < vocab && (bits[static_cast<size_t>(id / 64)] >> (id % 64) & 1);
      bool kept = true;
      if (row == 0 && id < vocab) kept = bit && id < marked;
      if (row == 2 && id < vocab) kept = bit;
      if (kept) {
        EXPECT_EQ(logits[at], before[at]) << row << " " << id;
      } else {
        EXPECT_EQ(logits[at], -INFINITY) << row << " " << id;
      }
    }
  }
  EXPECT_THROW(ops->mask_rows(view, {{rows, bits.data(), marked}}), Error);
}

TEST(IsaKernels, MatmulMatchesReferenceForEveryWeightType) {
  const IsaKernels& reference = cpu::generic_kernels();
  for (const IsaKernels* table : simd_tables()) {
    for (Shape shape :
         {Shape{1, 1, 1}, Shape{1, 37, 64}, Shape{3, 9, 17}, Shape{7, 33, 130}, Shape{16, 64, 256},
          Shape{41, 19, 48}, Shape{1, 40, 300}, Shape{5, 21, 160}}) {
      std::vector<float> x = random_values(static_cast<size_t>(shape.rows * shape.depth), 1);
      std::vector<float> bias = random_values(static_cast<size_t>(shape.cols), 3);
      for (auto [block_rows, block_cols] :
           {std::pair{16, 32}, std::pair{128, 128}, std::pair{3, 7}}) {
        TypedWeights weights(shape.cols, shape.depth, 2, block_rows, block_cols);
        for (const cpu::WeightMatrix& w : weights.matrices) {
          std::vector<float> want(static_cast<size_t>(shape.rows * shape.cols));
          std::vector<float> got(want.size());
          reference.matmul(x.data(), shape.depth, w, bias.data(), shape.rows, 0, shape.cols,
                           shape.depth, want.data(), shape.cols);
          // Split the columns the way threads do, to cover a range that does not start at 0.
          int64_t middle = shape.cols / 2;
          table->matmul(x.data(), shape.depth, w, bias.data(), shape.rows, 0, middle, shape.depth,
                        got.data(), shape.cols);
          table->matmul(x.data(), shape.depth, w, bias.data(), shape.rows, middle, shape.cols,
                        shape.depth, got.data(), shape.cols);
          EXPECT_LE(testing::max_abs_difference(want.data(), got.data(), want.size()),
                    1e-4f * std::sqrt(shape.depth))
              << table->name << " type " << static_cast<int>(w.type) << " " << shape.rows << "x"
              << shape.cols << "x" << shape.depth << " blocks " << block_rows << "x" << block_cols;
        }
      }
    }
  }
}

TEST(IsaKernels, Fp8MatmulEqualsWidenedWeights) {
  // The FP8 kernels must equal an f32 matmul over the dequantized weights, in every ISA.
  Shape shape{6, 24, 272};
  TypedWeights weights(shape.cols, shape.depth, 21, 16, 128);
  const cpu::WeightMatrix& fp8 = weights.matrices.back();
  std::vector<float> widened;
  for (int64_t r = 0; r < shape.cols; ++r) {
    for (int64_t c = 0; c < shape.depth; ++c) {
      widened.push_back(f8e4m3_to_f32(weights.fp8[static_cast<size_t>(r * shape.depth + c)]) *
                        fp8.scale(r, c));
    }
  }
  cpu::WeightMatrix f32{widened.data(), shape.depth, WeightType::kF32};
  std::vector<float> x = random_values(static_cast<size_t>(shape.rows * shape.depth), 22);
  std::vector<const IsaKernels*> tables = simd_tables();
  tables.push_back(&cpu::generic_kernels());
  for (const IsaKernels* table : tables) {
    for (int64_t rows : {int64_t{1}, shape.rows}) {
      std::vector<float> want(static_cast<size_t>(rows * shape.cols)), got(want.size());
      table->matmul(x.data(), shape.depth, f32, nullptr, rows, 0, shape.cols, shape.depth,
                    want.data(), shape.cols);
      table->matmul(x.data(), shape.depth, fp8, nullptr, rows, 0, shape.cols, shape.depth,
                    got.data(), shape.cols);
      EXPECT_LE(testing::max_abs_difference(want.data(), got.data(), want.size()), 1e-4f)
          << table->name << " rows " << rows;
    }
  }
}

TEST(IsaKernels, ColumnMatmulMatchesReferenceForEveryWeightType) {
  // y = x * W with W [depth, cols]: the orientation MLA's absorbed queries use.
  for (const IsaKernels* table : simd_tables()) {
    for (Shape shape : {Shape{1, 48, 16}, Shape{2, 37, 9}, Shape{3, 160, 20}}) {
      std::vector<float> x = random_values(static_cast<size_t>(shape.rows * shape.depth), 31);
      TypedWeights weights(shape.depth, shape.cols, 32, 8, 32);
      for (const cpu::WeightMatrix& w : weights.matrices) {
        std::vector<float> want(static_cast<size_t>(shape.rows * shape.cols)), got(want.size());
        cpu::generic_kernels().matmul_columns(x.data(), shape.depth, w, shape.rows, 0, shape.cols,
                                              shape.depth, want.data(), shape.cols);
        table->matmul_columns(x.data(), shape.depth, w, shape.rows, 0, 5, shape.depth, got.data(),
                              shape.cols);
        table->matmul_columns(x.data(), shape.depth, w, shape.rows, 5, shape.cols, shape.depth,
                              got.data(), shape.cols);
        EXPECT_LE(testing::max_abs_difference(want.data(), got.data(), want.size()), 1e-4f)
            << table->name << " type " << static_cast<int>(w.type);
      }
    }
  }
}

TEST(IsaKernels, Bf16DotProductsMatchReferenceOnRoundedInputs) {
  const IsaKernels* table = cpu::avx512_kernels();
  if (!__builtin_cpu_supports("avx512bf16") || table->matmul_bf16 == nullptr)
    GTEST_SKIP() << "no AVX512-BF16";
  for (Shape shape : {Shape{1, 5, 7}, Shape{5, 9, 33}, Shape{8, 20, 96}, Shape{13, 7, 200}}) {
    std::vector<float> x = random_values(static_cast<size_t>(shape.rows * shape.depth), 12);
    std::vector<float> w = random_values(static_cast<size_t>(shape.cols * shape.depth), 13);
    std::vector<uint16_t> x_bf16, w_bf16;
    for (float& value : x) x_bf16.push_back(f32_to_bf16(value));
    for (float& value : w) w_bf16.push_back(f32_to_bf16(value));
    std::vector<float> x_rounded;
    for (uint16_t bits : x_bf16) x_rounded.push_back(bf16_to_f32(bits));
    std::vector<float> want(static_cast<size_t>(shape.rows * shape.cols)), got(want.size());
    cpu::generic_kernels().matmul(x_rounded.data(), shape.depth,
                                  {w_bf16.data(), shape.depth, WeightType::kBF16}, nullptr,
                                  shape.rows, 0, shape.cols, shape.depth, want.data(), shape.cols);
    table->matmul_bf16(x_bf16.data(), shape.depth, w_bf16.data(), shape.depth, nullptr, shape.rows,
                       0, shape.cols, shape.depth, got.data(), shape.cols);
    // Products of bf16 values are exact in f32; only the summation order differs.
    EXPECT_LE(testing::max_abs_difference(want.data(), got.data(), want.size()), 1e-4f);
  }
}

TEST(IsaKernels, DotMatchesReference) {
  for (const IsaKernels* table : simd_tables()) {
    for (int64_t n : {1, 15, 16, 33, 200}) {
      std::vector<float> a = random_values(static_cast<size_t>(n), 4);
      std::vector<float> b = random_values(static_cast<size_t>(n), 5);
      EXPECT_NEAR(table->dot(a.data(), b.data(), n),
                  cpu::generic_kernels().dot(a.data(), b.data(), n), 1e-4f);
    }
  }
}

TEST(IsaKernels, AxpyMatchesReference) {
  for (const IsaKernels* table : simd_tables()) {
    for (int64_t n : {1, 15, 16, 33, 200}) {
      std::vector<float> x = random_values(static_cast<size_t>(n), 4);
      std::vector<float> want = random_values(static_cast<size_t>(n), 5), got = want;
      cpu::generic_kernels().axpy(0.75f, x.data(), want.data(), n);
      table->axpy(0.75f, x.data(), got.data(), n);
      EXPECT_LE(testing::max_abs_difference(want.data(), got.data(), want.size()), 1e-6f) << n;
    }
  }
}

// The batch-invariant kernel: row r's outputs are bitwise the same whether it runs alone, as
// part of any row count (full tiles, remainder rows) or in any column split, for every weight
// type; and they still match the reference.
TEST(IsaKernels, FixedOrderMatmulGivesEveryRowTheSameBitsInAnyBatch) {
  std::vector<const IsaKernels*> tables = simd_tables();
  tables.push_back(&cpu::generic_kernels());
  const int64_t cols = 45, depth = 300, rows = 23;
  std::vector<float> x = random_values(static_cast<size_t>(rows * depth), 4);
  std::vector<float> bias = random_values(static_cast<size_t>(cols), 5);
  TypedWeights weights(cols, depth, 6, 16, 128);
  for (const IsaKernels* table : tables) {
    for (const cpu::WeightMatrix& w : weights.matrices) {
      std::vector<float> alone(static_cast<size_t>(rows * cols));
      for (int64_t r = 0; r < rows; ++r) {
        table->matmul_fixed_order(x.data() + r * depth, depth, w, bias.data(), 1, 0, cols, depth,
                                  alone.data() + r * cols, cols);
      }
      std::vector<float> want(alone.size());
      cpu::generic_kernels().matmul(x.data(), depth, w, bias.data(), rows, 0, cols, depth,
                                    want.data(), cols);
      EXPECT_LE(testing::max_abs_difference(want.data(), alone.data(), want.size()), 1e-3f);
      for (int64_t batch : {2, 3, 4, 5, 8, 17, 23}) {
        for (int64_t split : {int64_t{0}, int64_t{16}, int64_t{7}}) {
          std::vector<float> got(static_cast<size_t>(batch * cols));
          table->matmul_fixed_order(x.data(), depth, w, bias.data(), batch, 0, split, depth,
                                    got.data(), cols);
          table->matmul_fixed_order(x.data(), depth, w, bias.data(), batch, split, cols, depth,
                                    got.data(), cols);
          EXPECT_EQ(0, std::memcmp(got.data(), alone.data(), got.size() * sizeof(float)))
              << table->name << " type " << static_cast<int>(w.type) << " rows " << batch
              << " split " << split;
        }
      }
    }
  }
}

// Plain attention over contiguous K/V of one sequence: the formula, written out.
std::vector<float> contiguous_attention(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, int new_tokens, int context,
                                        int heads, int kv_heads, int dim, float scale, int window) {
  std::vector<float> out(static_cast<size_t>(new_tokens * heads * dim), 0.0f);
  for (int t = 0; t < new_tokens; ++t) {
    int position = context - new_tokens + t;
    for (int h = 0; h < heads; ++h) {
      int kvh = h / (heads / kv_heads);
      std::vector<double> weights;
      double max_score = -1e30;
      for (int j = 0; j <= position; ++j) {
        double score = 0;
        bool visible = window == 0 || position - j < window;
        for (int d = 0; d < dim; ++d)
          score += q[static_cast<size_t>((t * heads + h) * dim + d)] *
                   k[static_cast<size_t>((j * kv_heads + kvh) * dim + d)];
        weights.push_back(visible ? score * scale : -1e30);
        max_score = std::max(max_score, weights.back());
      }
      double total = 0;
      for (double& weight : weights)
        total += (weight = weight <= -1e29 ? 0.0 : std::exp(weight - max_score));
      for (int j = 0; j <= position; ++j) {
        for (int d = 0; d < dim; ++d) {
          out[static_cast<size_t>((t * heads + h) * dim + d)] +=
              static_cast<float>(weights[static_cast<size_t>(j)] / total *
                                 v[static_cast<size_t>((j * kv_heads + kvh) * dim + d)]);
        }
      }
    }
  }
  return out;
}

TEST(CpuOps, PagedAttentionMatchesContiguousAttention) {
  auto ops = make_cpu_ops();
  const int heads = 4, kv_heads = 2, dim = 16, block_size = 4, context = 23, new_tokens = 5;
  const int num_blocks = 8;
  std::vector<float> k = random_values(static_cast<size_t>(context * kv_heads * dim), 6);
  std::vector<float> v = random_values(static_cast<size_t>(context * kv_heads * dim), 7);
  std::vector<float> q = random_values(static_cast<size_t>(new_tokens * heads * dim), 8);
  // Blocks in a scrambled order, as a real pool hands them out.
  std::vector<int32_t> table = {5, 2, 7, 0, 3, 6};
  std::vector<float> key_cache(static_cast<size_t>(num_blocks * block_size * kv_heads * dim));
  std::vector<float> value_cache(key_cache.size());
  std::vector<int64_t> slots;
  for (int position = 0; position < context; ++position) {
    slots.push_back(int64_t{table[static_cast<size_t>(position / block_size)]} * block_size +
                    position % block_size);
  }
  PagedKvView cache{key_cache.data(), value_cache.data(), block_size, kv_heads, dim, dim};
  std::vector<int32_t> query_start = {0, context};
  std::vector<int32_t> context_lens = {context};
  AttentionBatch all{1,
                     query_start.data(),
                     context_lens.data(),
                     table.data(),
                     static_cast<int>(table.size()),
                     slots.data()};
  Tensor v_view = Tensor::contiguous(v.data(), DType::kF32, {context, kv_heads, dim});
  ops->kv_write(Tensor::contiguous(k.data(), DType::kF32, {context, kv_heads, dim}), &v_view, all,
                cache);
  std::vector<int32_t> new_start = {0, new_tokens};
  AttentionBatch step{1,
                      new_start.data(),
                      context_lens.data(),
                      table.data(),
                      static_cast<int>(table.size()),
                      slots.data() + context - new_tokens};
  for (int window : {0, 3, 8}) {
    std::vector<float> out(q.size());
    Tensor out_view = Tensor::contiguous(out.data(), DType::kF32, {new_tokens, heads, dim});
    ops->paged_attention(Tensor::contiguous(q.data(), DType::kF32, {new_tokens, heads, dim}), step,
                         cache, 0.25f, window, out_view);
    std::vector<float> want =
        contiguous_attention(q, k, v, new_tokens, context, heads, kv_heads, dim, 0.25f, window);
    EXPECT_LE(testing::max_abs_difference(out.data(), want.data(), out.size()), 1e-5f)
        << "window " << window;
  }
}

TEST(CpuOps, RmsnormRopeAndGatedActivations) {
  auto ops = make_cpu_ops();
  std::vector<float> x = {1.0f, -2.0f, 3.0f, 4.0f};
  std::vector<uint16_t> weight = {f32_to_bf16(1.0f), f32_to_bf16(0.5f), f32_to_bf16(2.0f),
                                  f32_to_bf16(1.0f)};
  std::vector<float> y(4);
  Tensor y_view = Tensor::contiguous(y.data(), DType::kF32, {1, 4});
  ops->rmsnorm(Tensor::contiguous(x.data(), DType::kF32, {1, 4}),
               Tensor::contiguous(weight.data(), DType::kBF16, {4}), 0.0f, y_view);
  float rms = std::sqrt((1 + 4 + 9 + 16) / 4.0f);
  EXPECT_NEAR(y[1], -2.0f / rms * 0.5f, 1e-6f);
  EXPECT_NEAR(y[2], 3.0f / rms * 2.0f, 1e-6f);

  std::vector<float> head = {1.0f, 2.0f, 3.0f, 4.0f};
  float cos[2] = {0.0f, 1.0f}, sin[2] = {1.0f, 0.0f};
  Tensor head_view = Tensor::contiguous(head.data(), DType::kF32, {1, 1, 4});
  ops->rope(head_view, cos, sin, 4, false);  // pairs (0,2) rotate by 90 degrees, (1,3) stay
  EXPECT_EQ(head, (std::vector<float>{-3.0f, 2.0f, 1.0f, 4.0f}));
  std::vector<float> interleaved = {1.0f, 2.0f, 3.0f, 4.0f};
  Tensor interleaved_view = Tensor::contiguous(interleaved.data(), DType::kF32, {1, 1, 4});
  ops->rope(interleaved_view, cos, sin, 4, true);  // pairs (0,1) rotate, (2,3) stay
  EXPECT_EQ(interleaved, (std::vector<float>{-2.0f, 1.0f, 3.0f, 4.0f}));

  std::vector<float> gate = {0.0f, 1.0f}, up = {3.0f, 2.0f}, out(2);
  Tensor out_view = Tensor::contiguous(out.data(), DType::kF32, {1, 2});
  ops->silu_mul(Tensor::contiguous(gate.data(), DType::kF32, {1, 2}),
                Tensor::contiguous(up.data(), DType::kF32, {1, 2}), out_view);
  EXPECT_NEAR(out[0], 0.0f, 1e-7f);
  EXPECT_NEAR(out[1], 2.0f / (1.0f + std::exp(-1.0f)), 1e-6f);
}

TEST(CpuOps, GroupedMatmulsMatchSeparateCallsInBothPrecisions) {
  const int64_t rows = 5, depth = 96;
  std::vector<float> x = random_values(static_cast<size_t>(rows * depth), 14);
  Tensor x_view = Tensor::contiguous(x.data(), DType::kF32, {rows, depth});
  std::vector<std::vector<uint16_t>> weights;
  std::vector<float> bias = random_values(40, 15);
  for (int64_t cols : {40, 24, 72}) {
    std::vector<float> values =
        random_values(static_cast<size_t>(cols * depth), 16 + static_cast<uint32_t>(cols));
    weights.emplace_back();
    for (float value : values) weights.back().push_back(f32_to_bf16(value));
  }
  Tensor bias_view = Tensor::contiguous(bias.data(), DType::kF32, {40});
  for (MatmulPrecision precision : {MatmulPrecision::kF32, MatmulPrecision::kBf16}) {
    auto ops = make_cpu_ops(precision);
    std::vector<std::vector<float>> grouped, separate;
    std::vector<Tensor> weight_views, grouped_views, separate_views;
    for (const auto& w : weights) {
      int64_t cols = static_cast<int64_t>(w.size()) / depth;
      weight_views.push_back(
          Tensor::contiguous(const_cast<uint16_t*>(w.data()), DType::kBF16, {cols, depth}));
      grouped.emplace_back(static_cast<size_t>(rows * cols));
      separate.emplace_back(static_cast<size_t>(rows * cols));
    }
    for (size_t j = 0; j < weights.size(); ++j) {
      grouped_views.push_back(
          Tensor::contiguous(grouped[j].data(), DType::kF32, {rows, weight_views[j].dim(0)}));
      separate_views.push_back(
          Tensor::contiguous(separate[j].data(), DType::kF32, {rows, weight_views[j].dim(0)}));
    }
    ops->matmuls(x_view, {{&weight_views[0], &bias_view, &grouped_views[0]},
                          {&weight_views[1], nullptr, &grouped_views[1]},
                          {&weight_views[2], nullptr, &grouped_views[2]}});
    for (size_t j = 0; j < weights.size(); ++j) {
      ops->matmul(x_view, weight_views[j], j == 0 ? &bias_view : nullptr, separate_views[j]);
      EXPECT_EQ(grouped[j], separate[j]) << "job " << j;
    }
    // bf16 activations round x to 8 mantissa bits: results stay close to the f32 ones.
    auto exact = make_cpu_ops(MatmulPrecision::kF32);
    std::vector<float> reference(grouped[2].size());
    Tensor reference_view = Tensor::contiguous(reference.data(), DType::kF32, {rows, 72});
    exact->matmul(x_view, weight_views[2], nullptr, reference_view);
    EXPECT_LE(testing::max_abs_difference(reference.data(), grouped[2].data(), reference.size()),
              precision == MatmulPrecision::kF32 ? 0.0f : 2e-2f);
  }
}

TEST(CpuOps, EmbeddingRejectsIdsOutsideTheVocabulary) {
  auto ops = make_cpu_ops();
  std::vector<float> table = {1, 2, 3, 4, 5, 6};
  std::vector<float> out(2);
  Tensor out_view = Tensor::contiguous(out.data(), DType::kF32, {1, 2});
  int32_t good = 2, bad = 3;
  ops->embedding(Tensor::contiguous(table.data(), DType::kF32, {3, 2}), &good, out_view);
  EXPECT_EQ(out, (std::vector<float>{5, 6}));
  EXPECT_THROW(
      ops->embedding(Tensor::contiguous(table.data(), DType::kF32, {3, 2}), &bad, out_view), Error);
}

}  // namespace
}  // namespace deepinfer

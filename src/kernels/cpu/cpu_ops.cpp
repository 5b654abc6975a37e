// The CPU backend: the reference every other backend is tested against.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/token_bits.h"
#include "kernels/cpu/deepseek_v4.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/routing.h"
#include "kernels/ops.h"

namespace deepinfer {
namespace {

using cpu::IsaKernels;
using cpu::WeightType;

using cpu::WeightMatrix;

size_t weight_element_size(WeightType type) {
  switch (type) {
    case WeightType::kF32:
      return 4;
    case WeightType::kBF16:
    case WeightType::kF16:
      return 2;
    case WeightType::kF8E4M3:
      return 1;
  }
  return 0;
}

// The kernels' view of a weight: its stored type, and the block scales of an FP8 weight.
WeightMatrix weight_matrix(const Tensor& weight) {
  WeightMatrix matrix;
  matrix.data = weight.data;
  matrix.ld = weight.dim(-1);
  switch (weight.dtype) {
    case DType::kF32:
      matrix.type = WeightType::kF32;
      break;
    case DType::kBF16:
      matrix.type = WeightType::kBF16;
      break;
    case DType::kF16:
      matrix.type = WeightType::kF16;
      break;
    case DType::kF8E4M3:
      if (!weight.block_scales)
        fail("matmul: FP8 weight {} has no block scales", weight.shape_string());
      matrix.type = WeightType::kF8E4M3;
      matrix.scales = weight.block_scales->data;
      matrix.scale_ld = weight.block_scales->cols;
      matrix.block_rows = weight.block_scales->block_rows;
      matrix.block_cols = weight.block_scales->block_cols;
      break;
    default:
      fail("matmul: weights of dtype {} are not supported", dtype_name(weight.dtype));
  }
  return matrix;
}

// The rows [first, first + count) of a weight, keeping the scale lookup of the whole matrix.
WeightMatrix weight_rows(const WeightMatrix& whole, int64_t first) {
  WeightMatrix slice = whole;
  slice.data = static_cast<const char*>(whole.data) +
               first * whole.ld * static_cast<int64_t>(weight_element_size(whole.type));
  slice.first_row = whole.first_row + first;
  return slice;
}

float element_as_f32(const Tensor& tensor, int64_t index) {
  switch (tensor.dtype) {
    case DType::kF32:
      return tensor.as<const float>()[index];
    case DType::kBF16:
      return bf16_to_f32(tensor.as<const uint16_t>()[index]);
    case DType::kF16:
      return f16_to_f32(tensor.as<const uint16_t>()[index]);
    default:
      fail("dtype {} cannot be read as floating point", dtype_name(tensor.dtype));
  }
}

// Widens a 1-D parameter (norm weight, bias) to f32; they are small and reused per row.
std::vector<float> widen(const Tensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.numel()));
  for (int64_t i = 0; i < tensor.numel(); ++i)
    values[static_cast<size_t>(i)] = element_as_f32(tensor, i);
  return values;
}

int64_t rows_of(const Tensor& tensor) {
  return tensor.numel() / tensor.dim(-1);
}

// Distance between consecutive rows of a matmul operand: a 2-D view may be strided (a slice of
// a wider activation); higher ranks must be contiguous.
int64_t leading_dimension(const Tensor& tensor) {
  if (tensor.rank == 2) return tensor.strides[0];
  DI_CHECK(tensor.is_contiguous(), "matmul: operand {} must be 2-D or contiguous",
           tensor.shape_string());
  return tensor.dim(-1);
}

class CpuOps final : public Ops {
 public:
  CpuOps(MatmulPrecision precision, bool batch_invariant)
      : isa_(cpu::select_kernels()),
        pool_(ThreadPool::global()),
        precision_(precision),
        batch_invariant_(batch_invariant),
        matmul_kernel_(batch_invariant ? isa_.matmul_fixed_order : isa_.matmul) {
    DI_CHECK(!batch_invariant || precision == MatmulPrecision::kF32,
             "batch-invariant mode needs f32 matmul precision (bf16 prompt matmuls change "
             "their summation order with the row count)");
  }

  std::string name() const override { return std::string("cpu-") + isa_.name; }
  bool batch_invariant() const override { return batch_invariant_; }

  void matmul(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& y) override {
    matmuls(x, {{&weight, bias, &y}});
  }

  // Every job's output columns are cut into chunks and handed out from one counter, so each
  // weight row is read by exactly one thread and the whole group costs one dispatch.
  void matmuls(const Tensor& x, const std::vector<MatmulJob>& jobs) override {
    struct Piece {
      size_t job;
      int64_t begin, end;
    };
    std::vector<std::vector<float>> biases(jobs.size());
    std::vector<WeightMatrix> weights;
    int64_t total_cols = 0;
    bool any_shared_input = false;
    for (size_t j = 0; j < jobs.size(); ++j) {
      const MatmulJob& job = jobs[j];
      const Tensor& input = job.input ? *job.input : x;
      any_shared_input |= job.input == nullptr;
      DI_CHECK(job.weight->rank == 2 && job.weight->dim(1) == input.dim(-1),
               "matmul: weight {} does not match input depth {}", job.weight->shape_string(),
               input.dim(-1));
      DI_CHECK(job.out->dim(-1) == job.weight->dim(0) && rows_of(*job.out) == rows_of(input),
               "matmul: output {} is not [{}, {}]", job.out->shape_string(), rows_of(input),
               job.weight->dim(0));
      if (job.bias) biases[j] = widen(*job.bias);
      weights.push_back(weight_matrix(*job.weight));
      total_cols += job.weight->dim(0);
    }
    bool bf16_activations = any_shared_input && precision_ == MatmulPrecision::kBf16 &&
                            rows_of(x) > 1 && isa_.matmul_bf16;
    bf16_activations = bf16_activations && x.is_contiguous();
    if (bf16_activations) round_to_bf16(x);
    int64_t chunk = column_chunk(total_cols);
    std::vector<Piece> pieces;
    for (size_t j = 0; j < jobs.size(); ++j) {
      for (int64_t begin = 0; begin < jobs[j].weight->dim(0); begin += chunk) {
        pieces.push_back({j, begin, std::min(jobs[j].weight->dim(0), begin + chunk)});
      }
    }
    pool_.parallel_for_dynamic(
        static_cast<int64_t>(pieces.size()), 1, [&](int64_t first, int64_t last) {
          for (int64_t p = first; p < last; ++p) {
            const Piece& piece = pieces[static_cast<size_t>(p)];
            const MatmulJob& job = jobs[piece.job];
            const Tensor& input = job.input ? *job.input : x;
            const WeightMatrix& weight = weights[piece.job];
            const float* bias = job.bias ? biases[piece.job].data() : nullptr;
            int64_t depth = input.dim(-1);
            if (bf16_activations && !job.input && weight.type == WeightType::kBF16) {
              isa_.matmul_bf16(rounded_.data(), depth, job.weight->as<const uint16_t>(), depth,
                               bias, rows_of(input), piece.begin, piece.end, depth,
                               job.out->as<float>(), leading_dimension(*job.out));
            } else {
              matmul_kernel_(input.as<const float>(), leading_dimension(input), weight, bias,
                             rows_of(input), piece.begin, piece.end, depth, job.out->as<float>(),
                             leading_dimension(*job.out));
            }
          }
        });
  }

  void head_matmul(const Tensor& x, const Tensor& weight, const HeadSlices& slices, bool transposed,
                   Tensor& out) override {
    DI_CHECK(x.rank == 3 && out.rank == 3 && x.dim(0) == out.dim(0) && x.dim(1) == out.dim(1),
             "head_matmul: x {} and out {} must be [T, H, *]", x.shape_string(),
             out.shape_string());
    int64_t tokens = x.dim(0);
    int64_t heads = x.dim(1);
    int64_t in_width = transposed ? slices.rows : weight.dim(1);
    int64_t out_width = transposed ? weight.dim(1) : slices.rows;
    DI_CHECK(x.dim(2) == in_width && out.dim(2) == out_width &&
                 (heads - 1) * slices.head_stride + slices.row_begin + slices.rows <= weight.dim(0),
             "head_matmul: x {} / out {} do not fit weight {}", x.shape_string(),
             out.shape_string(), weight.shape_string());
    WeightMatrix whole = weight_matrix(weight);
    // One task per (head, column chunk): every head reads only its own rows of the weight.
    int64_t chunk = transposed ? std::max<int64_t>(16, out_width / 4 / 16 * 16) : out_width;
    int64_t chunks = (out_width + chunk - 1) / chunk;
    pool_.parallel_for_dynamic(heads * chunks, 1, [&](int64_t first, int64_t last) {
      for (int64_t item = first; item < last; ++item) {
        int64_t h = item / chunks;
        int64_t begin = item % chunks * chunk;
        int64_t end = std::min(out_width, begin + chunk);
        WeightMatrix rows = weight_rows(whole, h * slices.head_stride + slices.row_begin);
        const float* in = x.as<const float>() + h * x.strides[1];
        float* result = out.as<float>() + h * out.strides[1];
        if (transposed) {
          isa_.matmul_columns(in, x.strides[0], rows, tokens, begin, end, in_width, result,
                              out.strides[0]);
        } else {
          matmul_kernel_(in, x.strides[0], rows, nullptr, tokens, begin, end, in_width, result,
                         out.strides[0]);
        }
      }
    });
  }

  void route_experts(const Tensor& router_logits, const std::vector<float>& correction_bias,
                     const ExpertRouting& routing, const std::vector<int32_t>& fixed_experts,
                     int32_t* experts, float* weights) override {
    DI_CHECK(router_logits.dim(-1) == routing.num_experts &&
                 (correction_bias.empty() ||
                  static_cast<int>(correction_bias.size()) == routing.num_experts),
             "route_experts: logits {} or bias do not match {} experts",
             router_logits.shape_string(), routing.num_experts);
    int64_t tokens = rows_of(router_logits);
    int64_t k = routing.experts_per_token;
    pool_.parallel_for(tokens, 16, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        cpu::route_token(router_logits.as<const float>() + t * routing.num_experts, correction_bias,
                         routing, fixed_experts.empty() ? nullptr : fixed_experts.data() + t * k,
                         experts + t * k, weights + t * k);
      }
    });
  }

  void copy(const Tensor& source, Tensor& destination) override {
    check_copy_shapes(source, destination);
    std::array<int64_t, kMaxDims> extent{1, 1, 1, 1}, from{}, to{};
    int offset = kMaxDims - destination.rank;  // right-align: missing outer axes have extent 1
    for (int axis = 0; axis < destination.rank; ++axis) {
      auto at = static_cast<size_t>(axis + offset);
      extent[at] = destination.shape[static_cast<size_t>(axis)];
      from[at] = source.strides[static_cast<size_t>(axis)];
      to[at] = destination.strides[static_cast<size_t>(axis)];
    }
    const float* in = source.as<const float>();
    float* out = destination.as<float>();
    for (int64_t a = 0; a < extent[0]; ++a)
      for (int64_t b = 0; b < extent[1]; ++b)
        for (int64_t c = 0; c < extent[2]; ++c)
          for (int64_t d = 0; d < extent[3]; ++d)
            out[a * to[0] + b * to[1] + c * to[2] + d * to[3]] =
                in[a * from[0] + b * from[1] + c * from[2] + d * from[3]];
  }

  void gather_rows(const Tensor& x, const std::vector<int32_t>& rows, Tensor& out) override {
    int64_t width = x.dim(-1);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::copy_n(x.as<const float>() + int64_t{rows[i]} * width, width,
                  out.as<float>() + static_cast<int64_t>(i) * width);
    }
  }

  void add_scaled_rows(Tensor& y, const std::vector<int32_t>& rows,
                       const std::vector<float>& scales, const Tensor& x) override {
    int64_t width = y.dim(-1);
    for (size_t i = 0; i < rows.size(); ++i) {
      float* target = y.as<float>() + int64_t{rows[i]} * width;
      const float* source = x.as<const float>() + static_cast<int64_t>(i) * width;
      for (int64_t j = 0; j < width; ++j) target[j] += scales[i] * source[j];
    }
  }

  void embedding(const Tensor& table, const int32_t* ids, Tensor& out) override {
    int64_t width = table.dim(1);
    int64_t vocab = table.dim(0);
    int64_t count = rows_of(out);
    for (int64_t i = 0; i < count; ++i) {
      DI_CHECK(ids[i] >= 0 && ids[i] < vocab, "token id {} is outside the vocabulary (size {})",
               ids[i], vocab);
    }
    pool_.parallel_for(count, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float* row = out.as<float>() + i * width;
        for (int64_t j = 0; j < width; ++j) row[j] = element_as_f32(table, ids[i] * width + j);
      }
    });
  }

  void rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& y) override {
    int64_t width = x.dim(-1);
    DI_CHECK(weight.numel() == width, "rmsnorm: weight has {} values for rows of {}",
             weight.numel(), width);
    std::vector<float> scale = widen(weight);
    int64_t rows = rows_of(x);
    pool_.parallel_for(rows, 4, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* in = x.as<const float>() + x.row_offset(r);
        float* out = y.as<float>() + y.row_offset(r);
        float sum_squares = isa_.dot(in, in, width);
        float inverse_rms = 1.0f / std::sqrt(sum_squares / static_cast<float>(width) + eps);
        for (int64_t j = 0; j < width; ++j)
          out[j] = scale[static_cast<size_t>(j)] * (in[j] * inverse_rms);
      }
    });
  }

  void add(Tensor& y, const Tensor& x) override {
    float* out = y.as<float>();
    const float* in = x.as<const float>();
    int64_t count = y.numel();
    for (int64_t i = 0; i < count; ++i) out[i] += in[i];
  }

  void rope(Tensor& x, const float* cos, const float* sin, int rotary_dim,
            bool interleaved) override {
    int64_t tokens = x.dim(0);
    int64_t heads = x.dim(1);
    DI_CHECK(rotary_dim <= x.dim(2), "rope: rotary_dim {} exceeds head size {}", rotary_dim,
             x.dim(2));
    int half = rotary_dim / 2;
    for (int64_t t = 0; t < tokens; ++t) {
      const float* c = cos + t * half;
      const float* s = sin + t * half;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x.as<float>() + t * x.strides[0] + h * x.strides[1];
        for (int i = 0; i < half; ++i) {
          int first = interleaved ? 2 * i : i;
          int second = interleaved ? 2 * i + 1 : i + half;
          float a = v[first];
          float b = v[second];
          v[first] = a * c[i] - b * s[i];
          v[second] = b * c[i] + a * s[i];
        }
      }
    }
  }

  void hc_pre(const Tensor& streams, const HyperConnection& hc, Tensor* mix,
              Tensor& collapsed) override {
    cpu::hc_pre(pool_, streams, hc, mix, collapsed);
  }
  void hc_post(const Tensor& out, const Tensor& mix, Tensor& streams) override {
    cpu::hc_post(pool_, out, mix, streams);
  }
  void write_records(const Tensor& values, const AttentionBatch& batch,
                     const PagedRecords& records) override {
    cpu::write_records(values, batch, records);
  }
  void compress_windows(const PagedRecords& inputs, const Compressor& compressor,
                        const int32_t* windows, int64_t count, const float* cos, const float* sin,
                        const EntryStripes& entries) override {
    cpu::compress_windows(pool_, inputs, compressor, windows, count, cos, sin, entries);
  }
  void index_select(const Tensor& queries, const Tensor& head_weights, float scale,
                    const AttentionBatch& batch, const EntryStripes& entries, int64_t key_offset,
                    int k, int32_t* selected) override {
    cpu::index_select(pool_, queries, head_weights, scale, batch, entries, key_offset, k, selected);
  }
  void sparse_attention(const Tensor& q, const AttentionBatch& batch,
                        const PagedKvView& window_cache, int window, const EntryStripes& entries,
                        const int32_t* selected, int k, const Tensor& sinks, float scale,
                        Tensor& out) override {
    cpu::sparse_attention(pool_, q, batch, window_cache, window, entries, selected, k, sinks, scale,
                          out);
  }

  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    gated(gate, up, out, [](float g) { return g / (1.0f + std::exp(-g)); });
  }

  void clamped_silu_mul(const Tensor& gate, const Tensor& up, float limit, Tensor& out) override {
    int64_t count = out.numel();
    pool_.parallel_for(count, 256, [&](int64_t begin, int64_t end) {
      const float* g = gate.as<const float>();
      const float* u = up.as<const float>();
      float* result = out.as<float>();
      for (int64_t i = begin; i < end; ++i) {
        float a = std::min(g[i], limit);  // silu sees the clamped gate
        result[i] = a / (1.0f + std::exp(-a)) * std::clamp(u[i], -limit, limit);
      }
    });
  }

  void gelu_tanh_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    gated(gate, up, out, [](float g) {
      constexpr float kSqrt2OverPi = 0.7978845608028654f;
      return 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
    });
  }

  void kv_write(const Tensor& k, const Tensor* v, const AttentionBatch& batch,
                const PagedKvView& cache) override {
    int64_t key_width = cache.key_stride();
    int64_t value_width = int64_t{cache.num_kv_heads} * cache.value_dim;
    DI_CHECK(k.numel() == k.dim(0) * key_width, "kv_write: keys {} do not match the cache",
             k.shape_string());
    DI_CHECK(cache.values_in_keys == (v == nullptr),
             "kv_write: values must be given exactly when the cache stores them apart");
    DI_CHECK(cache.dtype == DType::kF32, "the CPU backend keeps its KV cache in f32");
    int64_t tokens = k.dim(0);
    for (int64_t t = 0; t < tokens; ++t) {
      int64_t slot = batch.slot_mapping[t];
      if (slot < 0) continue;  // restored KV a replay keeps
      std::copy_n(k.as<const float>() + t * key_width, key_width,
                  cache.key_floats() + slot * key_width);
      if (v) {
        std::copy_n(v->as<const float>() + t * value_width, value_width,
                    cache.value_floats() + slot * value_width);
      }
    }
  }

  void kv_read_keys(const PagedKvView& cache, const int32_t* block_table, int64_t count,
                    Tensor& keys) override {
    int64_t width = cache.key_stride();
    DI_CHECK(keys.numel() >= count * width, "kv_read_keys: output {} holds fewer than {} tokens",
             keys.shape_string(), count);
    DI_CHECK(cache.dtype == DType::kF32, "the CPU backend keeps its KV cache in f32");
    for (int64_t t = 0; t < count; ++t) {
      int64_t slot =
          int64_t{block_table[t / cache.block_size]} * cache.block_size + t % cache.block_size;
      std::copy_n(cache.key_floats() + slot * width, width, keys.as<float>() + t * width);
    }
  }

  void paged_attention(const Tensor& q, const AttentionBatch& batch, const PagedKvView& cache,
                       float scale, int window, Tensor& out) override;

  void sample_rows(const Tensor& logits, const std::vector<TokenDraw>& draws,
                   DrawnToken* out) override {
    int64_t vocab = logits.dim(-1);
    DI_CHECK(logits.rank == 2 && logits.strides[1] == 1 && logits.strides[0] >= vocab,
             "sample_rows: logits {} must be rows of adjacent values", logits.shape_string());
    const int64_t row_stride = logits.strides[0];
    for (const TokenDraw& draw : draws) {
      DI_CHECK(draw.row >= 0 && draw.row < rows_of(logits), "sample_rows: row {} of {}", draw.row,
               rows_of(logits));
    }
    pool_.parallel_for(static_cast<int64_t>(draws.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const TokenDraw& draw = draws[static_cast<size_t>(i)];
        out[i] = draw_token(logits.as<const float>() + draw.row * row_stride, vocab, draw);
      }
    });
  }

  void mask_rows(Tensor& logits, const std::vector<RowMask>& masks) override {
    const int64_t vocab = logits.dim(-1);
    DI_CHECK(logits.rank == 2 && logits.strides[1] == 1 && logits.strides[0] >= vocab,
             "mask_rows: logits {} must be rows of adjacent values", logits.shape_string());
    for (const RowMask& mask : masks) {
      DI_CHECK(mask.row >= 0 && mask.row < rows_of(logits) && mask.bits != nullptr,
               "mask_rows: row {} of {}", mask.row, rows_of(logits));
      ban_unmarked(mask.bits, mask.marked, logits.as<float>() + mask.row * logits.strides[0],
                   static_cast<int32_t>(vocab));
    }
  }

 private:
  struct GroupAttention {
    const PagedKvView* cache = nullptr;
    const int32_t* block_table = nullptr;
    const float* query = nullptr;  // [group, key_dim]
    int group = 0;
    int64_t key_offset = 0;
    int64_t value_offset = 0;
    int64_t first = 0;
    int64_t last = 0;
    float scale = 1.0f;
    float* out = nullptr;  // [group, value_dim]
  };
  void attend_group(const GroupAttention& task) const;

  template <typename Activation>
  void gated(const Tensor& gate, const Tensor& up, Tensor& out, Activation activation) {
    int64_t count = out.numel();
    pool_.parallel_for(count, 256, [&](int64_t begin, int64_t end) {
      const float* g = gate.as<const float>();
      const float* u = up.as<const float>();
      float* result = out.as<float>();
      for (int64_t i = begin; i < end; ++i) result[i] = activation(g[i]) * u[i];
    });
  }

  // Fills rounded_ with x rounded to bf16, for the bf16 dot-product kernels.
  void round_to_bf16(const Tensor& x) {
    rounded_.resize(static_cast<size_t>(x.numel()));
    const float* input = x.as<const float>();
    pool_.parallel_for(x.numel(), 1024, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        rounded_[static_cast<size_t>(i)] = f32_to_bf16(input[i]);
    });
  }

  // About eight chunks per thread, in multiples of 16 columns (the kernels' tile widths).
  int64_t column_chunk(int64_t cols) const {
    int64_t chunk = cols / (int64_t{pool_.size()} * 8);
    return std::max<int64_t>(16, (chunk + 15) / 16 * 16);
  }

  const IsaKernels& isa_;
  ThreadPool& pool_;
  MatmulPrecision precision_;
  bool batch_invariant_;
  decltype(cpu::IsaKernels::matmul) matmul_kernel_;
  std::vector<uint16_t> rounded_;  // activations rounded to bf16, reused across calls
};

// Attention of `group` query heads that share one KV head, for one query row over cached
// tokens [first, last]. Keys and values are read once for the whole group, block by block:
// scores [group, count] = q k^T as one small matmul per block, a softmax per head, then
// out [group, value_dim] = p v as one column-oriented matmul per block.
void CpuOps::attend_group(const GroupAttention& a) const {
  const PagedKvView& cache = *a.cache;
  int64_t count = a.last - a.first + 1;
  thread_local std::vector<float> scores, partial;
  scores.resize(static_cast<size_t>(a.group * count));
  partial.resize(static_cast<size_t>(a.group) * static_cast<size_t>(cache.value_dim));
  auto for_each_block = [&](auto visit) {
    for (int64_t token = a.first; token <= a.last;) {
      int64_t block = token / cache.block_size;
      int64_t offset = token - block * cache.block_size;
      int64_t n = std::min<int64_t>(cache.block_size - offset, a.last - token + 1);
      int64_t slot = int64_t{a.block_table[block]} * cache.block_size + offset;
      visit(token - a.first, slot, n);
      token += n;
    }
  };
  for_each_block([&](int64_t index, int64_t slot, int64_t n) {
    cpu::WeightMatrix keys{cache.key_floats() + slot * cache.key_stride() + a.key_offset,
                           cache.key_stride(), WeightType::kF32};
    matmul_kernel_(a.query, cache.key_dim, keys, nullptr, a.group, 0, n, cache.key_dim,
                   scores.data() + index, count);
  });
  for (int h = 0; h < a.group; ++h) {
    float* row = scores.data() + h * count;
    float max_score = -INFINITY;
    for (int64_t i = 0; i < count; ++i) max_score = std::max(max_score, row[i] * a.scale);
    float total = 0.0f;
    for (int64_t i = 0; i < count; ++i) total += row[i] = std::exp(row[i] * a.scale - max_score);
    float inverse_total = 1.0f / total;
    for (int64_t i = 0; i < count; ++i) row[i] *= inverse_total;
  }
  int64_t width = cache.value_dim;
  std::fill_n(a.out, a.group * width, 0.0f);
  for_each_block([&](int64_t index, int64_t slot, int64_t n) {
    cpu::WeightMatrix values{cache.value_floats() + slot * cache.value_stride() + a.value_offset,
                             cache.value_stride(), WeightType::kF32};
    isa_.matmul_columns(scores.data() + index, count, values, a.group, 0, width, n, partial.data(),
                        width);
    for (int64_t i = 0; i < a.group * width; ++i) a.out[i] += partial[static_cast<size_t>(i)];
  });
}

void CpuOps::paged_attention(const Tensor& q, const AttentionBatch& batch, const PagedKvView& cache,
                             float scale, int window, Tensor& out) {
  int64_t tokens = q.dim(0);
  int heads = static_cast<int>(q.dim(1));
  DI_CHECK(cache.dtype == DType::kF32, "the CPU backend keeps its KV cache in f32");
  DI_CHECK(q.dim(2) == cache.key_dim && out.dim(2) == cache.value_dim,
           "paged_attention: q {} / out {} do not match key size {} and value size {}",
           q.shape_string(), out.shape_string(), cache.key_dim, cache.value_dim);
  int group = heads / cache.num_kv_heads;
  // Map each query row to its sequence once, so work can be split over rows.
  std::vector<int> row_seq(static_cast<size_t>(tokens));
  for (int s = 0; s < batch.num_seqs; ++s) {
    for (int32_t r = batch.query_start[s]; r < batch.query_start[s + 1]; ++r)
      row_seq[static_cast<size_t>(r)] = s;
  }
  // Work items are (row, KV head, slice of the group's heads); a group is sliced only when
  // there are too few rows and KV heads to keep every thread busy (MLA decode: one of each).
  int64_t pairs = tokens * cache.num_kv_heads;
  int64_t wanted_slices = (2 * int64_t{pool_.size()} + pairs - 1) / pairs;
  int heads_per_slice = static_cast<int>((group + std::min<int64_t>(wanted_slices, group) - 1) /
                                         std::min<int64_t>(wanted_slices, group));
  int slices = (group + heads_per_slice - 1) / heads_per_slice;
  pool_.parallel_for_dynamic(pairs * slices, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      int64_t row = item / (int64_t{cache.num_kv_heads} * slices);
      int kv_head = static_cast<int>(item / slices % cache.num_kv_heads);
      int first_head = kv_head * group + static_cast<int>(item % slices) * heads_per_slice;
      int seq = row_seq[static_cast<size_t>(row)];
      int64_t new_tokens = batch.query_start[seq + 1] - batch.query_start[seq];
      int64_t position = batch.context_lens[seq] - new_tokens + (row - batch.query_start[seq]);
      GroupAttention task;
      task.cache = &cache;
      task.block_table = batch.block_tables + int64_t{seq} * batch.max_blocks_per_seq;
      task.query = q.as<const float>() + (row * heads + first_head) * cache.key_dim;
      task.group = std::min(heads_per_slice, (kv_head + 1) * group - first_head);
      task.key_offset = int64_t{kv_head} * cache.key_dim;
      task.value_offset =
          cache.values_in_keys ? task.key_offset : int64_t{kv_head} * cache.value_dim;
      task.first =
          window > 0 ? std::max<int64_t>(batch.window_start(seq), position - window + 1) : 0;
      task.last = position;
      task.scale = scale;
      task.out = out.as<float>() + (row * heads + first_head) * cache.value_dim;
      attend_group(task);
    }
  });
}

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(MatmulPrecision precision, bool batch_invariant) {
  return std::make_unique<CpuOps>(precision, batch_invariant);
}

}  // namespace deepinfer

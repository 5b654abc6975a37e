// The CPU backend: the reference every other backend is tested against.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/isa.h"
#include "kernels/ops.h"

namespace deepinfer {
namespace {

using cpu::IsaKernels;
using cpu::WeightType;

WeightType weight_type(const Tensor& weight) {
  switch (weight.dtype) {
    case DType::kF32:
      return WeightType::kF32;
    case DType::kBF16:
      return WeightType::kBF16;
    case DType::kF16:
      return WeightType::kF16;
    default:
      fail("matmul: weights of dtype {} are not supported", dtype_name(weight.dtype));
  }
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

class CpuOps final : public Ops {
 public:
  explicit CpuOps(MatmulPrecision precision)
      : isa_(cpu::select_kernels()), pool_(ThreadPool::global()), precision_(precision) {}

  std::string name() const override { return std::string("cpu-") + isa_.name; }

  void matmul(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& y) override {
    matmuls(x, {{&weight, bias, &y}});
  }

  // Every job's output columns are cut into chunks and handed out from one counter, so each
  // weight row is read by exactly one thread and the whole group costs one dispatch.
  void matmuls(const Tensor& x, const std::vector<MatmulJob>& jobs) override {
    int64_t depth = x.dim(-1);
    int64_t rows = rows_of(x);
    struct Piece {
      size_t job;
      int64_t begin, end;
    };
    std::vector<std::vector<float>> biases(jobs.size());
    std::vector<WeightType> types;
    int64_t total_cols = 0;
    for (size_t j = 0; j < jobs.size(); ++j) {
      const MatmulJob& job = jobs[j];
      DI_CHECK(job.weight->rank == 2 && job.weight->dim(1) == depth,
               "matmul: weight {} does not match input depth {}", job.weight->shape_string(),
               depth);
      DI_CHECK(job.out->dim(-1) == job.weight->dim(0) && rows_of(*job.out) == rows,
               "matmul: output {} is not [{}, {}]", job.out->shape_string(), rows,
               job.weight->dim(0));
      if (job.bias) biases[j] = widen(*job.bias);
      types.push_back(weight_type(*job.weight));
      total_cols += job.weight->dim(0);
    }
    bool bf16_activations = precision_ == MatmulPrecision::kBf16 && rows > 1 && isa_.matmul_bf16;
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
            const float* bias = job.bias ? biases[piece.job].data() : nullptr;
            int64_t cols = job.weight->dim(0);
            if (bf16_activations && types[piece.job] == WeightType::kBF16) {
              isa_.matmul_bf16(rounded_.data(), depth, job.weight->as<const uint16_t>(), depth,
                               bias, rows, piece.begin, piece.end, depth, job.out->as<float>(),
                               cols);
            } else {
              isa_.matmul(x.as<const float>(), depth, job.weight->data, depth, types[piece.job],
                          bias, rows, piece.begin, piece.end, depth, job.out->as<float>(), cols);
            }
          }
        });
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
        const float* in = x.as<const float>() + r * width;
        float* out = y.as<float>() + r * width;
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
    int64_t head_dim = x.dim(2);
    int half = rotary_dim / 2;
    for (int64_t t = 0; t < tokens; ++t) {
      const float* c = cos + t * half;
      const float* s = sin + t * half;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x.as<float>() + (t * heads + h) * head_dim;
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

  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    gated(gate, up, out, [](float g) { return g / (1.0f + std::exp(-g)); });
  }

  void gelu_tanh_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    gated(gate, up, out, [](float g) {
      constexpr float kSqrt2OverPi = 0.7978845608028654f;
      return 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
    });
  }

  void kv_write(const Tensor& k, const Tensor& v, const AttentionBatch& batch,
                const PagedKvView& cache) override {
    int64_t width = static_cast<int64_t>(cache.num_kv_heads) * cache.head_dim;
    int64_t tokens = k.dim(0);
    for (int64_t t = 0; t < tokens; ++t) {
      int64_t slot = batch.slot_mapping[t];
      std::copy_n(k.as<const float>() + t * width, width, cache.keys + slot * width);
      std::copy_n(v.as<const float>() + t * width, width, cache.values + slot * width);
    }
  }

  void paged_attention(const Tensor& q, const AttentionBatch& batch, const PagedKvView& cache,
                       float scale, int window, Tensor& out) override;

 private:
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
  std::vector<uint16_t> rounded_;  // activations rounded to bf16, reused across calls
};

void CpuOps::paged_attention(const Tensor& q, const AttentionBatch& batch, const PagedKvView& cache,
                             float scale, int window, Tensor& out) {
  int64_t tokens = q.dim(0);
  int heads = static_cast<int>(q.dim(1));
  int64_t head_dim = q.dim(2);
  int group = heads / cache.num_kv_heads;
  int64_t token_stride = int64_t{cache.num_kv_heads} * cache.head_dim;
  // Map each query row to its sequence once, so work can be split over (row, head) pairs.
  std::vector<int> row_seq(static_cast<size_t>(tokens));
  for (int s = 0; s < batch.num_seqs; ++s) {
    for (int32_t r = batch.query_start[s]; r < batch.query_start[s + 1]; ++r)
      row_seq[static_cast<size_t>(r)] = s;
  }
  pool_.parallel_for(tokens * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      int64_t row = item / heads;
      int head = static_cast<int>(item % heads);
      int seq = row_seq[static_cast<size_t>(row)];
      int64_t new_tokens = batch.query_start[seq + 1] - batch.query_start[seq];
      int64_t position = batch.context_lens[seq] - new_tokens + (row - batch.query_start[seq]);
      int64_t first = window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
      scores.resize(static_cast<size_t>(position - first + 1));
      isa_.attention_head(
          q.as<const float>() + (row * heads + head) * head_dim, cache.keys, cache.values,
          batch.block_tables + int64_t{seq} * batch.max_blocks_per_seq, cache.block_size,
          token_stride, int64_t{head / group} * cache.head_dim, cache.head_dim, first, position,
          scale, scores.data(), out.as<float>() + (row * heads + head) * head_dim);
    }
  });
}

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(MatmulPrecision precision) {
  return std::make_unique<CpuOps>(precision);
}

}  // namespace deepinfer

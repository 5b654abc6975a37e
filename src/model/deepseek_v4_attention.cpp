// DeepSeek-V4's attention layer: q LoRA, one shared K=V head over a sliding window, the
// compressors (CSA overlapping at a low rate, HCA disjoint at a high rate), the lightning
// indexer's top-k choice of compressed entries, per-head sinks, and the grouped low-rank
// output projection.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "core/error.h"
#include "model/deepseek_v4.h"

namespace deepinfer::v4 {
namespace {

// Rotates (or with sign -1 rotates back) the trailing `rope_dims` of a vector of width n,
// adjacent pairs (2i, 2i + 1).
void rotate_tail(float* x, int64_t n, int rope_dims, const float* cos, const float* sin,
                 float sign) {
  float* tail = x + n - rope_dims;
  for (int i = 0; i < rope_dims / 2; ++i) {
    float a = tail[2 * i], b = tail[2 * i + 1];
    float s = sign * sin[i];
    tail[2 * i] = a * cos[i] - b * s;
    tail[2 * i + 1] = b * cos[i] + a * s;
  }
}

void rms_normalize(float* x, int64_t n, double eps, const float* weight) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double{x[i]} * x[i];
  auto factor = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * factor * (weight ? weight[i] : 1.0f);
}

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

FloatTensor product(Ops& ops, const Tensor& x, const Tensor& weight) {
  FloatTensor y({x.dim(0), weight.dim(0)});
  Tensor view = y.view();
  ops.matmul(x, weight, nullptr, view);
  return y;
}

// One sequence's rows in the batch.
struct SequenceRows {
  int seq;
  int64_t first_row, rows, first_position;
};

SequenceRows sequence_rows(const ForwardBatch& batch, int seq) {
  int64_t first = batch.query_start[static_cast<size_t>(seq)];
  int64_t rows = batch.query_start[static_cast<size_t>(seq) + 1] - first;
  return {seq, first, rows, batch.context_lens[static_cast<size_t>(seq)] - rows};
}

// A compressor's part of the per-token input record: values then gates, `projected` each.
struct CompressorInputs {
  const CompressorWeights* weights;
  int64_t offset;  // of the values in the record; the gates follow
};

// Pools window `w` of a compressor into `entry` [width]: per channel, a softmax over the
// window's gates (plus position bias) weighting its values. Overlapping compressors pool the
// first halves of window w - 1 with the second halves of window w.
void pool_window(const TokenRecords& inputs, const CompressorInputs& c, int seq, int64_t w,
                 int rate, float* entry) {
  const CompressorWeights& weights = *c.weights;
  const int64_t width = weights.width;
  const int64_t projected = weights.projected();
  std::vector<float> values, gates;
  auto add_token = [&](int64_t position, int64_t offset_in_window, int64_t half) {
    std::vector<float> record(static_cast<size_t>(2 * projected));
    inputs.read(seq, position, c.offset, record.data(), 2 * projected);
    const float* bias = weights.position_bias.data() + offset_in_window * projected;
    for (int64_t i = 0; i < width; ++i) {
      values.push_back(record[static_cast<size_t>(half + i)]);
      gates.push_back(record[static_cast<size_t>(projected + half + i)] + bias[half + i]);
    }
  };
  if (weights.overlapping && w > 0) {
    for (int64_t i = 0; i < rate; ++i) add_token((w - 1) * rate + i, i, 0);
  }
  for (int64_t i = 0; i < rate; ++i) add_token(w * rate + i, i, weights.overlapping ? width : 0);
  auto slots = static_cast<int64_t>(values.size()) / width;
  for (int64_t ch = 0; ch < width; ++ch) {
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t s = 0; s < slots; ++s)
      top = std::max(top, gates[static_cast<size_t>(s * width + ch)]);
    float sum = 0.0f, pooled = 0.0f;
    for (int64_t s = 0; s < slots; ++s) {
      float e = std::exp(gates[static_cast<size_t>(s * width + ch)] - top);
      sum += e;
      pooled += e * values[static_cast<size_t>(s * width + ch)];
    }
    entry[ch] = pooled / sum;
  }
}

// What one layer reads and writes for one call.
struct LayerContext {
  Ops& ops;
  const ModelConfig& config;
  const CacheLayout& layout;
  const LayerWeights& layer;
  int index;
  const ForwardBatch& batch;
  const RopeTables& rope;
  KvCache& cache;
  const float* cos() const {
    return layer.kind == V4Attention::kSliding ? rope.main_cos.data() : rope.compress_cos.data();
  }
  const float* sin() const {
    return layer.kind == V4Attention::kSliding ? rope.main_sin.data() : rope.compress_sin.data();
  }
  int64_t entry_width() const {
    return config.head_dim +
           (layer.kind == V4Attention::kCompressedSparse ? config.v4.index_head_dim : 0);
  }
};

// Pools, normalises and rotates every window the sequence's new rows complete, and writes
// the entries' stripes.
void compress_completed_windows(const LayerContext& ctx, const SequenceRows& rows) {
  const AttentionWeights& a = ctx.layer.attention;
  const int rate = ctx.layer.rate;
  const int rope_dims = ctx.config.v4.rope_dims;
  const size_t layer = static_cast<size_t>(ctx.index);
  TokenRecords inputs(ctx.cache, ctx.batch, ctx.layout.input_layer[layer]);
  TokenRecords entries(ctx.cache, ctx.batch, ctx.layout.first_entry_layer,
                       ctx.layout.stripe_offset[layer]);
  const int64_t stripe = ctx.layout.stripe_width[layer];
  const int64_t width = ctx.entry_width();
  const int64_t hd = ctx.config.head_dim;
  std::vector<float> entry(static_cast<size_t>(width));
  std::vector<float> cos(static_cast<size_t>(rope_dims / 2)), sin(cos.size());
  int64_t end = rows.first_position + rows.rows;
  for (int64_t w = (rows.first_position + 1 + rate - 1) / rate - 1; (w + 1) * rate <= end; ++w) {
    if ((w + 1) * rate - 1 < rows.first_position) continue;
    auto position = static_cast<int32_t>(w * rate);
    ctx.rope.compress.compute(&position, 1, cos.data(), sin.data());
    pool_window(inputs, {&a.compressor, 0}, rows.seq, w, rate, entry.data());
    rms_normalize(entry.data(), hd, ctx.config.rms_norm_eps, a.compressor.norm.data());
    rotate_tail(entry.data(), hd, rope_dims, cos.data(), sin.data(), 1.0f);
    if (a.index_compressor.width > 0) {
      const int64_t index_width = a.index_compressor.width;
      float* key = entry.data() + hd;
      pool_window(inputs, {&a.index_compressor, 2 * a.compressor.projected()}, rows.seq, w, rate,
                  key);
      rms_normalize(key, index_width, ctx.config.rms_norm_eps, a.index_compressor.norm.data());
      rotate_tail(key, index_width, rope_dims, cos.data(), sin.data(), 1.0f);
    }
    for (int64_t first = 0, j = 0; first < width; first += stripe, ++j)
      entries.write(rows.seq, w * rate + j, 0, entry.data() + first,
                    std::min(stripe, width - first));
  }
}

// The sequence's compressed entries so far: [count, entry_width] (attention entry, then the
// indexer key for CSA).
std::vector<float> gather_entries(const LayerContext& ctx, const SequenceRows& rows,
                                  int64_t count) {
  const size_t layer = static_cast<size_t>(ctx.index);
  TokenRecords entries(ctx.cache, ctx.batch, ctx.layout.first_entry_layer,
                       ctx.layout.stripe_offset[layer]);
  const int64_t stripe = ctx.layout.stripe_width[layer];
  const int64_t width = ctx.entry_width();
  std::vector<float> gathered(static_cast<size_t>(count * width));
  for (int64_t w = 0; w < count; ++w) {
    for (int64_t first = 0, j = 0; first < width; first += stripe, ++j)
      entries.read(rows.seq, w * ctx.layer.rate + j, 0, gathered.data() + w * width + first,
                   std::min(stripe, width - first));
  }
  return gathered;
}

// The lightning indexer's choice for one query: the top-k visible entries by
// sum_h weight_h * relu(q_h . key_w), ties to the lower index.
std::vector<int64_t> select_entries(const DeepseekV4Config& v4, const float* queries,
                                    const float* head_weights, const float* entries,
                                    int64_t entry_width, int64_t key_offset, int64_t visible) {
  const int64_t index_dim = v4.index_head_dim;
  const float key_scale = 1.0f / std::sqrt(static_cast<float>(index_dim));
  std::vector<float> scores(static_cast<size_t>(visible));
  for (int64_t w = 0; w < visible; ++w) {
    const float* key = entries + w * entry_width + key_offset;
    float score = 0.0f;
    for (int h = 0; h < v4.index_heads; ++h)
      score += head_weights[h] * std::max(0.0f, dot(queries + h * index_dim, key, index_dim));
    scores[static_cast<size_t>(w)] = score * key_scale;
  }
  std::vector<int64_t> order(static_cast<size_t>(visible));
  std::iota(order.begin(), order.end(), 0);
  auto k = std::min<int64_t>(v4.index_topk, visible);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
    float sa = scores[static_cast<size_t>(a)], sb = scores[static_cast<size_t>(b)];
    return sa > sb || (sa == sb && a < b);
  });
  order.resize(static_cast<size_t>(k));
  return order;
}

// Softmax attention of one head's query over `keys` (values are the keys) with the sink in
// the denominator.
void attend_head(const float* q, const std::vector<const float*>& keys, int64_t hd, float scale,
                 float sink, float* out) {
  std::vector<float> logits(keys.size());
  float top = sink;
  for (size_t j = 0; j < keys.size(); ++j) {
    logits[j] = scale * dot(q, keys[j], hd);
    top = std::max(top, logits[j]);
  }
  float sum = std::exp(sink - top);
  std::fill(out, out + hd, 0.0f);
  for (size_t j = 0; j < keys.size(); ++j) {
    float e = std::exp(logits[j] - top);
    sum += e;
    for (int64_t i = 0; i < hd; ++i) out[i] += e * keys[j][i];
  }
  for (int64_t i = 0; i < hd; ++i) out[i] /= sum;
}

// Queries and shared K=V rows of the new tokens, normalised and rotated.
struct Projections {
  FloatTensor q_latent;  // [T, q_lora_rank], normalised (also the indexer's input)
  FloatTensor q;         // [T, H * hd]
  FloatTensor kv;        // [T, hd]
};

Projections project(const LayerContext& ctx, const Tensor& normed) {
  const ModelConfig& c = ctx.config;
  const AttentionWeights& a = ctx.layer.attention;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const int64_t tokens = normed.dim(0), hd = c.head_dim;
  const int rope_dims = c.v4.rope_dims;
  Projections p{product(ctx.ops, normed, *a.q_down), {}, product(ctx.ops, normed, *a.kv)};
  Tensor latent = p.q_latent.view();
  ctx.ops.rmsnorm(latent, *a.q_norm, eps, latent);
  p.q = product(ctx.ops, latent, *a.q_up);
  Tensor kv = p.kv.view();
  ctx.ops.rmsnorm(kv, *a.kv_norm, eps, kv);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* cos = ctx.cos() + t * rope_dims / 2;
    const float* sin = ctx.sin() + t * rope_dims / 2;
    for (int h = 0; h < c.num_heads; ++h) {
      float* head = p.q.data() + (t * c.num_heads + h) * hd;
      rms_normalize(head, hd, c.rms_norm_eps, nullptr);
      rotate_tail(head, hd, rope_dims, cos, sin, 1.0f);
    }
    rotate_tail(p.kv.data() + t * hd, hd, rope_dims, cos, sin, 1.0f);
  }
  return p;
}

// Writes the new rows' K=V rows and compressor inputs into the cache.
void write_state(const LayerContext& ctx, const Tensor& normed, const Projections& p) {
  const ModelConfig& c = ctx.config;
  const AttentionWeights& a = ctx.layer.attention;
  const auto layer = static_cast<size_t>(ctx.index);
  TokenRecords window(ctx.cache, ctx.batch, ctx.layout.window_layer[layer]);
  std::vector<FloatTensor> inputs;
  if (ctx.layer.kind != V4Attention::kSliding) {
    for (const CompressorWeights* compressor : {&a.compressor, &a.index_compressor}) {
      if (compressor->width == 0) continue;
      inputs.push_back(product(ctx.ops, normed, *compressor->values));
      inputs.push_back(product(ctx.ops, normed, *compressor->gates));
    }
  }
  std::optional<TokenRecords> records;
  if (!inputs.empty()) records.emplace(ctx.cache, ctx.batch, ctx.layout.input_layer[layer]);
  for (int seq = 0; seq < ctx.batch.num_seqs(); ++seq) {
    SequenceRows rows = sequence_rows(ctx.batch, seq);
    for (int64_t r = 0; r < rows.rows; ++r) {
      int64_t t = rows.first_row + r, position = rows.first_position + r;
      window.write(seq, position, 0, p.kv.data() + t * c.head_dim, c.head_dim);
      int64_t offset = 0;
      for (const FloatTensor& part : inputs) {
        int64_t width = part.dim(1);
        records->write(seq, position, offset, part.data() + t * width, width);
        offset += width;
      }
    }
    if (!inputs.empty()) compress_completed_windows(ctx, rows);
  }
}

// The indexer's queries [T, nI * cI] (rotated, no norm) and per-head weights [T, nI].
struct IndexerQueries {
  FloatTensor queries, weights;
};

IndexerQueries indexer_queries(const LayerContext& ctx, const Tensor& normed,
                               const Projections& p) {
  const DeepseekV4Config& v4 = ctx.config.v4;
  const AttentionWeights& a = ctx.layer.attention;
  IndexerQueries out{product(ctx.ops, p.q_latent.view(), *a.index_q_up),
                     product(ctx.ops, normed, *a.index_weights)};
  const float head_scale = 1.0f / std::sqrt(static_cast<float>(v4.index_heads));
  for (int64_t t = 0; t < normed.dim(0); ++t) {
    for (int h = 0; h < v4.index_heads; ++h) {
      float* q = out.queries.data() + (t * v4.index_heads + h) * v4.index_head_dim;
      rotate_tail(q, v4.index_head_dim, v4.rope_dims, ctx.cos() + t * v4.rope_dims / 2,
                  ctx.sin() + t * v4.rope_dims / 2, 1.0f);
      out.weights.data()[t * v4.index_heads + h] *= head_scale;
    }
  }
  return out;
}

// Attention of the sequence's new rows into heads [T, H * hd] (de-rotated).
void attend_sequence(const LayerContext& ctx, const SequenceRows& rows, const Projections& p,
                     const IndexerQueries* indexer, float* heads) {
  const ModelConfig& c = ctx.config;
  const int64_t hd = c.head_dim;
  const int rate = ctx.layer.rate;
  const int window = c.v4.window;
  const auto layer = static_cast<size_t>(ctx.index);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  TokenRecords window_rows(ctx.cache, ctx.batch, ctx.layout.window_layer[layer]);
  int64_t end = rows.first_position + rows.rows;
  int64_t count = rate > 0 ? end / rate : 0;
  std::vector<float> entries = count > 0 ? gather_entries(ctx, rows, count) : std::vector<float>();
  const int64_t entry_width = ctx.entry_width();
  for (int64_t r = 0; r < rows.rows; ++r) {
    int64_t t = rows.first_row + r, position = rows.first_position + r;
    std::vector<const float*> keys;
    for (int64_t j = std::max<int64_t>(0, position - window + 1); j <= position; ++j)
      keys.push_back(window_rows.at(rows.seq, j, 0));
    int64_t visible = rate > 0 ? (position + 1) / rate : 0;
    if (indexer && visible > 0) {
      const int64_t qi_width = int64_t{c.v4.index_heads} * c.v4.index_head_dim;
      for (int64_t w : select_entries(c.v4, indexer->queries.data() + t * qi_width,
                                      indexer->weights.data() + t * c.v4.index_heads,
                                      entries.data(), entry_width, hd, visible))
        keys.push_back(entries.data() + w * entry_width);
    } else {
      for (int64_t w = 0; w < visible; ++w) keys.push_back(entries.data() + w * entry_width);
    }
    const float* cos = ctx.cos() + t * c.v4.rope_dims / 2;
    const float* sin = ctx.sin() + t * c.v4.rope_dims / 2;
    for (int h = 0; h < c.num_heads; ++h) {
      float* out = heads + (t * c.num_heads + h) * hd;
      attend_head(p.q.data() + (t * c.num_heads + h) * hd, keys, hd, scale,
                  ctx.layer.attention.sinks[static_cast<size_t>(h)], out);
      rotate_tail(out, hd, c.v4.rope_dims, cos, sin, -1.0f);
    }
  }
}

}  // namespace

void run_attention(Ops& ops, const ModelConfig& config, const CacheLayout& layout,
                   const LayerWeights& layer, int layer_index, const ForwardBatch& batch,
                   const RopeTables& rope, KvCache& cache, const Tensor& normed, float* out) {
  LayerContext ctx{ops, config, layout, layer, layer_index, batch, rope, cache};
  const int64_t tokens = normed.dim(0);
  const int64_t hd = config.head_dim;
  Projections p = project(ctx, normed);
  write_state(ctx, normed, p);
  std::optional<IndexerQueries> indexer;
  if (layer.kind == V4Attention::kCompressedSparse) indexer = indexer_queries(ctx, normed, p);
  FloatTensor heads({tokens, int64_t{config.num_heads} * hd});
  for (int seq = 0; seq < batch.num_seqs(); ++seq)
    attend_sequence(ctx, sequence_rows(batch, seq), p, indexer ? &*indexer : nullptr, heads.data());
  // Grouped output: group g's heads through its own block of wo_a, then wo_b mixes them.
  const auto groups = static_cast<int64_t>(layer.attention.out_groups.size());
  const int64_t group_in = int64_t{config.num_heads} * hd / groups;
  const int64_t rank = layer.attention.out_groups.front().dim(0);
  FloatTensor group_input({tokens, group_in}), mixed({tokens, groups * rank});
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t t = 0; t < tokens; ++t)
      std::copy_n(heads.data() + t * groups * group_in + g * group_in, group_in,
                  group_input.data() + t * group_in);
    FloatTensor y =
        product(ops, group_input.view(), layer.attention.out_groups[static_cast<size_t>(g)]);
    for (int64_t t = 0; t < tokens; ++t)
      std::copy_n(y.data() + t * rank, rank, mixed.data() + t * groups * rank + g * rank);
  }
  Tensor result = Tensor::contiguous(out, DType::kF32, {tokens, config.hidden_size});
  ops.matmul(mixed.view(), *layer.attention.out_mix, nullptr, result);
}

}  // namespace deepinfer::v4

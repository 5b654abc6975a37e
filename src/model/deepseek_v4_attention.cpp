// DeepSeek-V4's attention layer: q LoRA, one shared K=V head over a sliding window, the
// compressors (CSA overlapping at a low rate, HCA disjoint at a high rate), the lightning
// indexer's top-k choice of compressed entries, per-head sinks, and the grouped low-rank
// output projection.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/deepseek_v4.h"

namespace deepinfer::v4 {

std::vector<int> StepTables::rates(const ModelConfig& config) {
  std::vector<int> rates;
  for (int rate : config.v4.layer_rate) {
    if (rate > 0 && std::find(rates.begin(), rates.end(), rate) == rates.end())
      rates.push_back(rate);
  }
  return rates;
}

StepTables StepTables::of(const ModelConfig& config, const ForwardBatch& batch, bool pair_per_row) {
  const DeepseekV4Config& v4 = config.v4;
  const int64_t tokens = batch.num_tokens();
  const auto half = static_cast<size_t>(v4.rope_dims / 2);
  RotaryEmbedding main(v4.main_rope, v4.rope_dims), compress(v4.compress_rope, v4.rope_dims);
  StepTables t;
  t.rope.assign(2 * kFirstWindowRope, std::vector<float>(static_cast<size_t>(tokens) * half));
  main.compute(batch.positions.data(), tokens, t.rope[0].data(), t.rope[1].data());
  compress.compute(batch.positions.data(), tokens, t.rope[4].data(), t.rope[5].data());
  for (int turned : {kMainBack, kCompressBack}) {
    const auto& turning_cos = turned == kMainBack ? t.rope[0] : t.rope[4];
    const auto& turning_sin = turned == kMainBack ? t.rope[1] : t.rope[5];
    t.rope[static_cast<size_t>(2 * turned)] = turning_cos;
    for (size_t i = 0; i < turning_sin.size(); ++i)
      t.rope[static_cast<size_t>(2 * turned + 1)][i] = -turning_sin[i];
  }
  for (int rate : rates(config)) {
    std::vector<int32_t> pairs, first_positions;
    for (int s = 0; s < batch.num_seqs(); ++s) {
      const int64_t end = batch.context_lens[static_cast<size_t>(s)];
      const int64_t first = end - (batch.query_start[static_cast<size_t>(s) + 1] -
                                   batch.query_start[static_cast<size_t>(s)]);
      const size_t before = pairs.size();
      // Window w completes at its last token (w + 1) * rate - 1. A replay pools none that
      // ends before its restored entries do (they hold those windows already).
      const int64_t restored_end =
          batch.restored_ends.empty() ? 0 : batch.restored_ends[static_cast<size_t>(s)];
      for (int64_t w = std::max(first, restored_end) / rate; (w + 1) * rate <= end; ++w) {
        pairs.insert(pairs.end(), {s, static_cast<int32_t>(w)});
        first_positions.push_back(static_cast<int32_t>(w * rate));
      }
      if (!pair_per_row) continue;
      DI_CHECK(pairs.size() - before <= 2, "a recorded step has one new token per sequence");
      if (pairs.size() == before) {
        pairs.insert(pairs.end(), {-1, 0});
        first_positions.push_back(0);
      }
    }
    std::vector<float> cos(first_positions.size() * half), sin(cos.size());
    compress.compute(first_positions.data(), static_cast<int64_t>(first_positions.size()),
                     cos.data(), sin.data());
    t.rope.push_back(std::move(cos));
    t.rope.push_back(std::move(sin));
    t.windows.push_back(std::move(pairs));
  }
  return t;
}

ForwardContext::ForwardContext(Ops& ops, const ModelConfig& config, const ForwardBatch& batch_in)
    : batch(batch_in),
      rates_(StepTables::rates(config)),
      host_(StepTables::of(config, batch_in, false)) {
  tables_.emplace(ops, batch);
  token_ids = tables_->tokens();
  for (int g = 0; g < static_cast<int>(batch.block_tables.size()); ++g)
    attention.push_back(tables_->attention(g));
  copies_.resize(host_.rope.size() + host_.windows.size());
  std::vector<const float*> cos, sin;
  for (size_t r = 0; r < host_.rope.size(); r += 2) {
    cos.push_back(backend_floats(ops, host_.rope[r], copies_[r]));
    sin.push_back(backend_floats(ops, host_.rope[r + 1], copies_[r + 1]));
  }
  std::vector<const int32_t*> pairs;
  std::vector<int64_t> counts;
  for (size_t k = 0; k < host_.windows.size(); ++k) {
    pairs.push_back(backend_ints(ops, host_.windows[k], copies_[host_.rope.size() + k]));
    counts.push_back(static_cast<int64_t>(host_.windows[k].size() / 2));
  }
  bind(cos, sin, pairs, counts);
}

ForwardContext::ForwardContext(const ModelConfig& config, const ForwardBatch& batch_in,
                               const ForwardInputs& inputs)
    : batch(batch_in), rates_(StepTables::rates(config)) {
  token_ids = inputs.token_ids;
  attention = inputs.attention;
  bind(inputs.cos, inputs.sin, inputs.indices,
       std::vector<int64_t>(rates_.size(), batch.num_seqs()));
}

void ForwardContext::bind(const std::vector<const float*>& cos,
                          const std::vector<const float*>& sin,
                          const std::vector<const int32_t*>& pairs,
                          const std::vector<int64_t>& counts) {
  DI_CHECK(cos.size() == StepTables::kFirstWindowRope + rates_.size() && sin.size() == cos.size() &&
               pairs.size() == rates_.size(),
           "DeepSeek-V4 forward: {} rope tables and {} window lists for {} rates", cos.size(),
           pairs.size(), rates_.size());
  main_cos = cos[StepTables::kMainRope];
  main_sin = sin[StepTables::kMainRope];
  main_unsin = sin[StepTables::kMainBack];
  compress_cos = cos[StepTables::kCompressRope];
  compress_sin = sin[StepTables::kCompressRope];
  compress_unsin = sin[StepTables::kCompressBack];
  for (size_t k = 0; k < rates_.size(); ++k) {
    windows_.push_back({pairs[k], counts[k], cos[StepTables::kFirstWindowRope + k],
                        sin[StepTables::kFirstWindowRope + k]});
  }
}

const ForwardContext::Windows& ForwardContext::windows_of(int rate) const {
  auto found = std::find(rates_.begin(), rates_.end(), rate);
  DI_CHECK(found != rates_.end(), "DeepSeek-V4 forward: no windows of rate {}", rate);
  return windows_[static_cast<size_t>(found - rates_.begin())];
}

namespace {

// What one layer reads and writes for one call.
struct LayerContext {
  Ops& ops;
  const ModelConfig& config;
  const CacheLayout& layout;
  const LayerWeights& layer;
  int index;
  ForwardContext& forward;
  KvCache& cache;

  bool sliding() const { return layer.kind == V4Attention::kSliding; }
  const float* cos() const { return sliding() ? forward.main_cos : forward.compress_cos; }
  const float* sin() const { return sliding() ? forward.main_sin : forward.compress_sin; }
  const float* unsin() const { return sliding() ? forward.main_unsin : forward.compress_unsin; }
  int64_t tokens() const { return forward.batch.num_tokens(); }
  AttentionBatch view_of(int cache_layer) const {
    return forward.attention[static_cast<size_t>(
        cache.groups().layer_group[static_cast<size_t>(cache_layer)])];
  }
  // The records starting at `first_cache_layer` (element `offset` of each token's row).
  PagedRecords records(int first_cache_layer, int64_t offset) const {
    PagedRecords r;
    for (int l = first_cache_layer; l < cache.shape().num_layers; ++l) {
      r.layers.push_back(cache.layer(l).key_floats());
      r.tables.push_back(view_of(l).block_tables);
    }
    r.max_blocks_per_seq = forward.batch.max_blocks_per_seq;
    r.block_size = cache.shape().block_size;
    r.row = layout.row;
    r.offset = offset;
    return r;
  }
  EntryStripes entries() const {
    auto l = static_cast<size_t>(index);
    if (sliding()) return {};
    return {records(layout.first_entry_layer, layout.stripe_offset[l]), layout.stripe_width[l],
            layer.rate};
  }
};

// A view of backend floats.
Tensor view(const LayerContext& ctx, float* data, std::initializer_list<int64_t> shape,
            std::initializer_list<int64_t> strides) {
  return Tensor::strided(data, DType::kF32, shape, strides, ctx.ops.device());
}

BackendTensor product(Ops& ops, const Tensor& x, const Tensor& weight) {
  BackendTensor y(ops, {x.dim(0), weight.dim(0)});
  Tensor out = y.view();
  ops.matmul(x, weight, nullptr, out);
  return y;
}

// Rotates (or with `sin` negated, rotates back) the trailing rope dims of each head of
// x [T, heads * width], adjacent pairs.
void rotate_tails(const LayerContext& ctx, BackendTensor& x, int64_t heads, int64_t width,
                  const float* sin) {
  const int rope_dims = ctx.config.v4.rope_dims;
  Tensor tails = view(ctx, x.data() + width - rope_dims, {x.dim(0), heads, rope_dims},
                      {heads * width, width, 1});
  ctx.ops.rope(tails, ctx.cos(), sin, rope_dims, true);
}

// Queries and shared K=V rows of the new tokens, normalised and rotated.
struct Projections {
  BackendTensor q_latent;  // [T, q_lora_rank], normalised (also the indexer's input)
  BackendTensor q;         // [T, H * hd]
  BackendTensor kv;        // [T, hd]
};

Projections project(const LayerContext& ctx, const Tensor& normed, const Tensor& ones) {
  const ModelConfig& c = ctx.config;
  const AttentionWeights& a = ctx.layer.attention;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const int64_t hd = c.head_dim;
  Projections p{product(ctx.ops, normed, *a.q_down), {}, product(ctx.ops, normed, *a.kv)};
  Tensor latent = p.q_latent.view();
  ctx.ops.rmsnorm(latent, *a.q_norm, eps, latent);
  p.q = product(ctx.ops, latent, *a.q_up);
  Tensor heads = view(ctx, p.q.data(), {ctx.tokens(), c.num_heads, hd}, {c.num_heads * hd, hd, 1});
  ctx.ops.rmsnorm(heads, ones, eps, heads);  // unweighted, per head
  rotate_tails(ctx, p.q, c.num_heads, hd, ctx.sin());
  Tensor kv = p.kv.view();
  ctx.ops.rmsnorm(kv, *a.kv_norm, eps, kv);
  rotate_tails(ctx, p.kv, 1, hd, ctx.sin());
  return p;
}

Compressor compressor_of(const LayerContext& ctx, const CompressorWeights& w, int64_t input_offset,
                         int64_t entry_offset) {
  Compressor c;
  c.position_bias = &w.position_bias.view();
  c.norm = &w.norm.view();
  c.width = w.width;
  c.rate = ctx.layer.rate;
  c.overlapping = w.overlapping;
  c.input_offset = input_offset;
  c.entry_offset = entry_offset;
  c.eps = static_cast<float>(ctx.config.rms_norm_eps);
  c.rope_dims = ctx.config.v4.rope_dims;
  return c;
}

// Writes the new rows' K=V rows and compressor inputs, then pools every window they complete.
void write_state(const LayerContext& ctx, const Tensor& normed, const Projections& p) {
  const ModelConfig& c = ctx.config;
  const AttentionWeights& a = ctx.layer.attention;
  const auto layer = static_cast<size_t>(ctx.index);
  const int window_layer = ctx.layout.window_layer[layer];
  Tensor kv = view(ctx, p.kv.data(), {ctx.tokens(), 1, c.head_dim}, {c.head_dim, c.head_dim, 1});
  ctx.ops.kv_write(kv, nullptr, ctx.view_of(window_layer), ctx.cache.layer(window_layer));
  if (ctx.sliding()) return;
  // Each token's input record: values then gates of the attention compressor, then (CSA) of
  // the indexer's.
  const int64_t width = ctx.layout.input_width[layer];
  BackendTensor record(ctx.ops, {ctx.tokens(), width});
  int64_t offset = 0;
  for (const CompressorWeights* w : {&a.compressor, &a.index_compressor}) {
    if (w->width == 0) continue;
    for (const Tensor* weight : {w->values, w->gates}) {
      BackendTensor part = product(ctx.ops, normed, *weight);
      Tensor slice = view(ctx, record.data() + offset, {ctx.tokens(), part.dim(1)}, {width, 1});
      ctx.ops.copy(part.view(), slice);
      offset += part.dim(1);
    }
  }
  PagedRecords inputs = ctx.records(ctx.layout.input_layer[layer], 0);
  ctx.ops.write_records(record.view(), ctx.view_of(window_layer), inputs);
  const ForwardContext::Windows& done = ctx.forward.windows_of(ctx.layer.rate);
  if (done.count == 0) return;
  EntryStripes entries = ctx.entries();
  ctx.ops.compress_windows(inputs, compressor_of(ctx, a.compressor, 0, 0), done.pairs, done.count,
                           done.cos, done.sin, entries);
  if (a.index_compressor.width > 0) {
    ctx.ops.compress_windows(
        inputs, compressor_of(ctx, a.index_compressor, 2 * a.compressor.projected(), c.head_dim),
        done.pairs, done.count, done.cos, done.sin, entries);
  }
}

// The lightning indexer's choice of entries for every row: [T, index_topk] in backend memory.
BackendMemory select_entries(const LayerContext& ctx, const Tensor& normed, const Projections& p) {
  const DeepseekV4Config& v4 = ctx.config.v4;
  const AttentionWeights& a = ctx.layer.attention;
  BackendTensor queries = product(ctx.ops, p.q_latent.view(), *a.index_q_up);
  rotate_tails(ctx, queries, v4.index_heads, v4.index_head_dim, ctx.sin());
  BackendTensor weights = product(ctx.ops, normed, *a.index_weights);
  BackendMemory selected =
      ctx.ops.allocate_scratch(static_cast<size_t>(ctx.tokens() * v4.index_topk) * 4);
  Tensor heads = view(ctx, queries.data(), {ctx.tokens(), v4.index_heads, v4.index_head_dim},
                      {int64_t{v4.index_heads} * v4.index_head_dim, v4.index_head_dim, 1});
  float scale = 1.0f / std::sqrt(static_cast<float>(v4.index_heads) * v4.index_head_dim);
  ctx.ops.index_select(heads, weights.view(), scale,
                       ctx.view_of(ctx.layout.window_layer[static_cast<size_t>(ctx.index)]),
                       ctx.entries(), ctx.config.head_dim, v4.index_topk,
                       static_cast<int32_t*>(selected.get()));
  return selected;
}

// out [T, D] = wo_b . concat_g(wo_a_g . heads of group g). The groups' inputs and outputs are
// regrouped group-major with one copy each way, so every product reads and writes dense rows;
// a single row is already group-major and needs neither copy.
void project_out(const LayerContext& ctx, BackendTensor& heads, Tensor& out) {
  const AttentionWeights& a = ctx.layer.attention;
  const auto groups = static_cast<int64_t>(a.out_groups.size());
  const int64_t tokens = ctx.tokens(), width = heads.dim(1), group_in = width / groups;
  const int64_t rank = a.out_groups.front().dim(0);
  BackendTensor mixed(ctx.ops, {tokens, groups * rank});
  BackendTensor inputs, outputs;
  float* input = heads.data();
  float* output = mixed.data();
  if (tokens > 1) {
    inputs = BackendTensor(ctx.ops, {groups, tokens, group_in});
    outputs = BackendTensor(ctx.ops, {groups, tokens, rank});
    Tensor regrouped = inputs.view();
    ctx.ops.copy(view(ctx, heads.data(), {groups, tokens, group_in}, {group_in, width, 1}),
                 regrouped);
    input = inputs.data();
    output = outputs.data();
  }
  for (int64_t g = 0; g < groups; ++g) {
    Tensor y = view(ctx, output + g * tokens * rank, {tokens, rank}, {rank, 1});
    ctx.ops.matmul(view(ctx, input + g * tokens * group_in, {tokens, group_in}, {group_in, 1}),
                   a.out_groups[static_cast<size_t>(g)], nullptr, y);
  }
  if (tokens > 1) {
    Tensor token_major = view(ctx, mixed.data(), {groups, tokens, rank}, {rank, groups * rank, 1});
    ctx.ops.copy(outputs.view(), token_major);
  }
  ctx.ops.matmul(mixed.view(), *a.out_mix, nullptr, out);
}

}  // namespace

void run_attention(Ops& ops, const ModelConfig& config, const CacheLayout& layout,
                   const LayerWeights& layer, int layer_index, ForwardContext& forward,
                   KvCache& cache, const Tensor& ones, const Tensor& normed, Tensor& out) {
  LayerContext ctx{ops, config, layout, layer, layer_index, forward, cache};
  const int64_t hd = config.head_dim, heads = config.num_heads;
  Projections p = project(ctx, normed, ones);
  write_state(ctx, normed, p);
  BackendMemory selected;
  if (layer.kind == V4Attention::kCompressedSparse) selected = select_entries(ctx, normed, p);
  BackendTensor attended(ops, {ctx.tokens(), heads * hd});
  const int window_layer = layout.window_layer[static_cast<size_t>(layer_index)];
  Tensor q = view(ctx, p.q.data(), {ctx.tokens(), heads, hd}, {heads * hd, hd, 1});
  Tensor result = view(ctx, attended.data(), {ctx.tokens(), heads, hd}, {heads * hd, hd, 1});
  ops.sparse_attention(q, ctx.view_of(window_layer), cache.layer(window_layer), config.v4.window,
                       ctx.entries(), static_cast<const int32_t*>(selected.get()),
                       config.v4.index_topk, layer.attention.sinks.view(),
                       1.0f / std::sqrt(static_cast<float>(hd)), result);
  // Values carry the keys' rotation: turn each head's output back at the query's position.
  rotate_tails(ctx, attended, heads, hd, ctx.unsin());
  project_out(ctx, attended, out);
}

}  // namespace deepinfer::v4

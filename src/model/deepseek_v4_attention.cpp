// DeepSeek-V4's attention layer: q LoRA, one shared K=V head over a sliding window, the
// compressors (CSA overlapping at a low rate, HCA disjoint at a high rate), the lightning
// indexer's top-k choice of compressed entries, per-head sinks, and the grouped low-rank
// output projection.
#include <cmath>

#include "core/error.h"
#include "model/deepseek_v4.h"

namespace deepinfer::v4 {

ForwardContext::ForwardContext(Ops& ops, const ModelConfig& config, const ForwardBatch& batch_in)
    : batch(batch_in),
      tables(ops, batch_in),
      compress_rope(config.v4.compress_rope, config.v4.rope_dims) {
  const DeepseekV4Config& v4 = config.v4;
  const int64_t tokens = batch.num_tokens();
  for (std::vector<float>& table : host_tables)
    table.resize(static_cast<size_t>(tokens * v4.rope_dims / 2));
  RotaryEmbedding(v4.main_rope, v4.rope_dims)
      .compute(batch.positions.data(), tokens, host_tables[0].data(), host_tables[1].data());
  compress_rope.compute(batch.positions.data(), tokens, host_tables[3].data(),
                        host_tables[4].data());
  for (size_t i = 0; i < host_tables[1].size(); ++i) {
    host_tables[2][i] = -host_tables[1][i];
    host_tables[5][i] = -host_tables[4][i];
  }
  const float* device[6];
  for (int i = 0; i < 6; ++i) device[i] = backend_floats(ops, host_tables[i], copies[i]);
  main_cos = device[0];
  main_sin = device[1];
  main_unsin = device[2];
  compress_cos = device[3];
  compress_sin = device[4];
  compress_unsin = device[5];
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
    return forward.tables.attention(cache.groups().layer_group[static_cast<size_t>(cache_layer)]);
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

// The windows the batch completes: (sequence, window) pairs, and cos/sin at their first
// positions.
struct CompletedWindows {
  std::vector<int32_t> pairs;
  std::vector<float> cos, sin;
  BackendMemory cos_copy, sin_copy;
};

CompletedWindows completed_windows(const LayerContext& ctx) {
  const ForwardBatch& batch = ctx.forward.batch;
  const int rate = ctx.layer.rate;
  CompletedWindows done;
  std::vector<int32_t> positions;
  for (int s = 0; s < batch.num_seqs(); ++s) {
    int64_t end = batch.context_lens[static_cast<size_t>(s)];
    int64_t first = end - (batch.query_start[static_cast<size_t>(s) + 1] -
                           batch.query_start[static_cast<size_t>(s)]);
    // Window w completes at its last token (w + 1) * rate - 1.
    for (int64_t w = first / rate; (w + 1) * rate <= end; ++w) {
      done.pairs.insert(done.pairs.end(), {s, static_cast<int32_t>(w)});
      positions.push_back(static_cast<int32_t>(w * rate));
    }
  }
  auto half = static_cast<size_t>(ctx.config.v4.rope_dims / 2);
  done.cos.resize(positions.size() * half);
  done.sin.resize(done.cos.size());
  ctx.forward.compress_rope.compute(positions.data(), static_cast<int64_t>(positions.size()),
                                    done.cos.data(), done.sin.data());
  return done;
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
  CompletedWindows done = completed_windows(ctx);
  if (done.pairs.empty()) return;
  const float* cos = backend_floats(ctx.ops, done.cos, done.cos_copy);
  const float* sin = backend_floats(ctx.ops, done.sin, done.sin_copy);
  EntryStripes entries = ctx.entries();
  ctx.ops.compress_windows(inputs, compressor_of(ctx, a.compressor, 0, 0), done.pairs, cos, sin,
                           entries);
  if (a.index_compressor.width > 0) {
    ctx.ops.compress_windows(
        inputs, compressor_of(ctx, a.index_compressor, 2 * a.compressor.projected(), c.head_dim),
        done.pairs, cos, sin, entries);
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

// out [T, D] = wo_b . concat_g(wo_a_g . heads of group g).
void project_out(const LayerContext& ctx, BackendTensor& heads, Tensor& out) {
  const AttentionWeights& a = ctx.layer.attention;
  const auto groups = static_cast<int64_t>(a.out_groups.size());
  const int64_t width = heads.dim(1), group_in = width / groups;
  const int64_t rank = a.out_groups.front().dim(0);
  BackendTensor group_input(ctx.ops, {ctx.tokens(), group_in});
  BackendTensor mixed(ctx.ops, {ctx.tokens(), groups * rank});
  for (int64_t g = 0; g < groups; ++g) {
    Tensor input = group_input.view();
    ctx.ops.copy(view(ctx, heads.data() + g * group_in, {ctx.tokens(), group_in}, {width, 1}),
                 input);
    Tensor slice = view(ctx, mixed.data() + g * rank, {ctx.tokens(), rank}, {groups * rank, 1});
    BackendTensor y = product(ctx.ops, input, a.out_groups[static_cast<size_t>(g)]);
    ctx.ops.copy(y.view(), slice);
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

// DeepSeek-V2 and V3: multi-head latent attention (MLA) over a latent or expanded KV cache,
// mixture-of-experts feed-forward layers, FP8 block-scaled weights, and MTP modules.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/layers.h"
#include "model/moe.h"
#include "model/rope.h"

namespace deepinfer {
namespace {

struct MlaWeights {
  const Tensor* q_proj = nullptr;  // set without a q LoRA
  const Tensor* q_a_proj = nullptr;
  const Tensor* q_a_norm = nullptr;
  const Tensor* q_b_proj = nullptr;
  const Tensor* kv_a_proj = nullptr;  // kv_a_proj_with_mqa: [latent | rope key]
  const Tensor* kv_a_norm = nullptr;
  const Tensor* kv_b_proj = nullptr;  // per head: nope rows of W_UK, then v rows of W_UV
  const Tensor* o_proj = nullptr;
};

struct DeepseekLayer {
  const Tensor* input_norm = nullptr;
  const Tensor* post_attention_norm = nullptr;
  MlaWeights attention;
  bool is_moe = false;
  GatedMlp mlp;  // dense layers
  MoeWeights moe;
};

struct MtpModule {
  DeepseekLayer layer;
  std::map<std::string, const Tensor*> weights;
};

// Activations of one forward, sized for its token count.
struct Scratch {
  Scratch(const ModelConfig& c, int64_t tokens)
      : hidden({tokens, c.hidden_size}),
        normed({tokens, c.hidden_size}),
        q_compressed({tokens, std::max(c.mla.q_lora_rank, 1)}),
        q({tokens, int64_t{c.num_heads} * c.mla.qk_head_dim()}),
        compressed_kv({tokens, int64_t{c.mla.kv_lora_rank} + c.mla.qk_rope_head_dim}),
        attention({tokens, int64_t{c.num_heads} * c.mla.v_head_dim}) {}
  FloatTensor hidden, normed, q_compressed, q, compressed_kv, attention;
};

// Views into MLA activations: rows of `width` floats holding per-head or latent parts.
struct MlaDims {
  int64_t heads, nope, rope, qk, v, rank;
  int64_t latent_width() const { return rank + rope; }  // one cached token (latent form)
};

Tensor q_part(const FloatTensor& q, const MlaDims& d, int64_t offset, int64_t width) {
  return Tensor::strided(q.data() + offset, DType::kF32, {q.dim(0), d.heads, width},
                         {d.heads * d.qk, d.qk, 1});
}

class DeepseekModel final : public CausalLM {
 public:
  DeepseekModel(ModelConfig config, std::unique_ptr<TensorStore> store,
                const ModelLoadOptions& options, Ops& ops)
      : config_(std::move(config)),
        store_(std::move(store)),
        ops_(ops),
        cache_form_(options.mla_cache),
        rope_(config_.layer_rope.front(), config_.mla.qk_rope_head_dim) {
    const MlaConfig& m = config_.mla;
    dims_ = {config_.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim,
             m.qk_head_dim(),   m.v_head_dim,       m.kv_lora_rank};
    softmax_scale_ = 1.0f / std::sqrt(static_cast<float>(m.qk_head_dim()));
    const RopeConfig& rope = config_.layer_rope.front();
    if (rope.type != RopeType::kDefault && rope.mscale_all_dim > 0) {
      auto mscale = static_cast<float>(yarn_mscale(rope.factor, rope.mscale_all_dim));
      softmax_scale_ *= mscale * mscale;
    }
    expand_min_tokens_ =
        options.mla_expand_min_tokens > 0 ? options.mla_expand_min_tokens : break_even_tokens();
    // The absorbed and expanding paths round differently, and which one runs depends on how
    // many tokens a sequence adds: a batch-invariant run always takes the absorbed one.
    if (ops.batch_invariant()) expand_min_tokens_ = std::numeric_limits<int>::max();
    bind_weights();
  }

  const ModelConfig& config() const override { return config_; }
  Ops& ops() const override { return ops_; }

  KvCacheShape kv_shape(int block_size) const override {
    if (cache_form_ == MlaCache::kLatent) {
      return KvCacheShape{config_.num_layers,
                          1,
                          static_cast<int>(dims_.latent_width()),
                          static_cast<int>(dims_.rank),
                          block_size,
                          true,
                          {}};
    }
    return KvCacheShape{config_.num_layers,
                        config_.num_heads,
                        static_cast<int>(dims_.qk),
                        static_cast<int>(dims_.v),
                        block_size,
                        false,
                        {}};
  }

  std::vector<const Tensor*> weights_read_per_token() const override;

  // The expanded form prompts use: qk-wide scores and v-wide sums per head and context token.
  double attention_flops_per_token(double context) const override {
    return 2.0 * config_.num_layers * dims_.heads * (dims_.qk + dims_.v) * context;
  }

  void forward(const ForwardBatch& batch, KvCache& cache, float* logits,
               const HiddenStateSink& hidden_sink) override;

  int num_mtp_modules() const override { return static_cast<int>(mtp_.size()); }
  std::map<std::string, const Tensor*> mtp_module_weights(int index) const override {
    DI_CHECK(index >= 0 && index < num_mtp_modules(), "MTP module {} does not exist", index);
    return mtp_[static_cast<size_t>(index)].weights;
  }

 private:
  // Tokens per sequence above which expanding the cached latents costs less arithmetic than
  // the absorbed form: expansion costs rank * heads * (nope + v) per context token once, the
  // absorbed form (rank + rope + rank) - (qk + v) more per query, head and context token.
  int break_even_tokens() const {
    int64_t extra = 2 * dims_.rank + dims_.rope - dims_.qk - dims_.v;
    return static_cast<int>(
        std::max<int64_t>(1, dims_.rank * (dims_.nope + dims_.v) / std::max<int64_t>(extra, 1)));
  }
  void bind_weights();
  DeepseekLayer bind_layer(const std::string& prefix, int layer_index);
  void attention_block(const DeepseekLayer& layer, int layer_index, const ForwardBatch& batch,
                       KvCache& cache, Scratch& s, const float* cos, const float* sin);
  void expand_keys_values(const MlaWeights& w, const Tensor& latent, const float* rope_keys,
                          int64_t rope_stride, FloatTensor& keys, FloatTensor& values);
  void attend_expanded_cache(const MlaWeights& w, const AttentionBatch& view, const PagedKvView& kv,
                             Scratch& s, Tensor& out);
  void attend_expanding_latents(const MlaWeights& w, const ForwardBatch& batch, int seq,
                                const PagedKvView& kv, Scratch& s, Tensor& out);
  void attend_absorbed(const MlaWeights& w, const ForwardBatch& batch, const std::vector<int>& seqs,
                       const PagedKvView& kv, Scratch& s, Tensor& out);
  void feed_forward(const DeepseekLayer& layer, Scratch& s);

  ModelConfig config_;
  std::unique_ptr<TensorStore> store_;
  Ops& ops_;
  MlaCache cache_form_;
  RotaryEmbedding rope_;
  MlaDims dims_{};
  float softmax_scale_ = 1.0f;
  int expand_min_tokens_ = 1;
  const Tensor* embed_ = nullptr;
  const Tensor* final_norm_ = nullptr;
  const Tensor* lm_head_ = nullptr;
  std::vector<DeepseekLayer> layers_;
  std::vector<MtpModule> mtp_;
};

DeepseekLayer DeepseekModel::bind_layer(const std::string& prefix, int layer_index) {
  const ModelConfig& c = config_;
  const MlaDims& d = dims_;
  int64_t hidden = c.hidden_size;
  const TensorStore& store = *store_;
  DeepseekLayer layer;
  layer.input_norm = layer_weight(store, prefix + "input_layernorm.weight", {hidden});
  layer.post_attention_norm =
      layer_weight(store, prefix + "post_attention_layernorm.weight", {hidden});
  MlaWeights& a = layer.attention;
  std::string p = prefix + "self_attn.";
  if (c.mla.q_lora_rank > 0) {
    int64_t q_rank = c.mla.q_lora_rank;
    a.q_a_proj = layer_weight(store, p + "q_a_proj.weight", {q_rank, hidden});
    a.q_a_norm = layer_weight(store, p + "q_a_layernorm.weight", {q_rank});
    a.q_b_proj = layer_weight(store, p + "q_b_proj.weight", {d.heads * d.qk, q_rank});
  } else {
    a.q_proj = layer_weight(store, p + "q_proj.weight", {d.heads * d.qk, hidden});
  }
  a.kv_a_proj = layer_weight(store, p + "kv_a_proj_with_mqa.weight", {d.latent_width(), hidden});
  a.kv_a_norm = layer_weight(store, p + "kv_a_layernorm.weight", {d.rank});
  a.kv_b_proj = layer_weight(store, p + "kv_b_proj.weight", {d.heads * (d.nope + d.v), d.rank});
  a.o_proj = layer_weight(store, p + "o_proj.weight", {hidden, d.heads * d.v});
  layer.is_moe = c.moe.is_moe_layer(layer_index);
  if (layer.is_moe) {
    layer.moe = bind_moe(store, prefix + "mlp.", c);
  } else {
    layer.mlp = bind_gated_mlp(store, prefix + "mlp.", hidden, c.intermediate_size);
  }
  return layer;
}

void DeepseekModel::bind_weights() {
  const ModelConfig& c = config_;
  int64_t hidden = c.hidden_size;
  const TensorStore& store = *store_;
  embed_ = layer_weight(store, "model.embed_tokens.weight", {c.vocab_size, hidden});
  final_norm_ = layer_weight(store, "model.norm.weight", {hidden});
  lm_head_ = (c.tie_word_embeddings && !store.contains("lm_head.weight"))
                 ? embed_
                 : layer_weight(store, "lm_head.weight", {c.vocab_size, hidden});
  for (int i = 0; i < c.num_layers; ++i)
    layers_.push_back(bind_layer(fmt::format("model.layers.{}.", i), i));
  // MTP modules follow the last layer: a decoder layer plus the projections that join the
  // previous depth's hidden state with the next token's embedding.
  for (int m = 0; m < c.num_mtp_layers; ++m) {
    int index = c.num_layers + m;
    std::string prefix = fmt::format("model.layers.{}.", index);
    MtpModule module;
    module.layer = bind_layer(prefix, index);
    layer_weight(store, prefix + "enorm.weight", {hidden});
    layer_weight(store, prefix + "hnorm.weight", {hidden});
    layer_weight(store, prefix + "eh_proj.weight", {hidden, 2 * hidden});
    layer_weight(store, prefix + "shared_head.norm.weight", {hidden});
    if (store.contains(prefix + "shared_head.head.weight"))
      layer_weight(store, prefix + "shared_head.head.weight", {c.vocab_size, hidden});
    if (store.contains(prefix + "embed_tokens.weight"))
      layer_weight(store, prefix + "embed_tokens.weight", {c.vocab_size, hidden});
    for (const std::string& name : store.names()) {
      if (name.rfind(prefix, 0) == 0) module.weights[name.substr(prefix.size())] = &store.get(name);
    }
    mtp_.push_back(std::move(module));
  }
}

std::vector<const Tensor*> DeepseekModel::weights_read_per_token() const {
  // Routed experts differ per token; any experts_per_token of them weigh the same, so the
  // first ones stand in for the active set.
  std::vector<const Tensor*> read = {lm_head_, final_norm_};
  auto add_mlp = [&](const GatedMlp& mlp) {
    if (mlp.gate) read.insert(read.end(), {mlp.gate, mlp.up, mlp.down});
  };
  for (const DeepseekLayer& layer : layers_) {
    const MlaWeights& a = layer.attention;
    for (const Tensor* tensor :
         {layer.input_norm, layer.post_attention_norm, a.q_proj, a.q_a_proj, a.q_a_norm, a.q_b_proj,
          a.kv_a_proj, a.kv_a_norm, a.kv_b_proj, a.o_proj}) {
      if (tensor) read.push_back(tensor);
    }
    if (!layer.is_moe) {
      add_mlp(layer.mlp);
      continue;
    }
    read.push_back(layer.moe.router);
    add_mlp(layer.moe.shared);
    for (int e = 0; e < config_.moe.experts_per_token; ++e)
      add_mlp(layer.moe.experts[static_cast<size_t>(e)]);
  }
  return read;
}

// keys [n, heads, qk] = [W_UK latent | rope key], values [n, heads, v] = W_UV latent.
void DeepseekModel::expand_keys_values(const MlaWeights& w, const Tensor& latent,
                                       const float* rope_keys, int64_t rope_stride,
                                       FloatTensor& keys, FloatTensor& values) {
  const MlaDims& d = dims_;
  int64_t n = latent.dim(0);
  FloatTensor expanded({n, d.heads * (d.nope + d.v)});
  Tensor expanded_view = expanded.view();
  ops_.matmul(latent, *w.kv_b_proj, nullptr, expanded_view);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < d.heads; ++h) {
      const float* source = expanded.data() + (t * d.heads + h) * (d.nope + d.v);
      float* key = keys.data() + (t * d.heads + h) * d.qk;
      std::copy_n(source, d.nope, key);
      std::copy_n(rope_keys + t * rope_stride, d.rope, key + d.nope);
      std::copy_n(source + d.nope, d.v, values.data() + (t * d.heads + h) * d.v);
    }
  }
}

void DeepseekModel::attend_expanded_cache(const MlaWeights& w, const AttentionBatch& view,
                                          const PagedKvView& kv, Scratch& s, Tensor& out) {
  const MlaDims& d = dims_;
  int64_t tokens = s.q.dim(0);
  FloatTensor keys({tokens, d.heads, d.qk});
  FloatTensor values({tokens, d.heads, d.v});
  Tensor latent =
      Tensor::strided(s.compressed_kv.data(), DType::kF32, {tokens, d.rank}, {d.latent_width(), 1});
  expand_keys_values(w, latent, s.compressed_kv.data() + d.rank, d.latent_width(), keys, values);
  ops_.kv_write(keys.view(), &values.view(), view, kv);
  Tensor q = Tensor::contiguous(s.q.data(), DType::kF32, {tokens, d.heads, d.qk});
  ops_.paged_attention(q, view, kv, softmax_scale_, 0, out);
}

// A long new chunk: expand every cached latent of the sequence into per-head keys and values
// (once per forward) and attend as plain multi-head attention.
void DeepseekModel::attend_expanding_latents(const MlaWeights& w, const ForwardBatch& batch,
                                             int seq, const PagedKvView& kv, Scratch& s,
                                             Tensor& out) {
  const MlaDims& d = dims_;
  auto index = static_cast<size_t>(seq);
  int32_t context = batch.context_lens[index];
  int32_t first_row = batch.query_start[index];
  int32_t rows = batch.query_start[index + 1] - first_row;
  FloatTensor cached({context, d.latent_width()});
  Tensor cached_view = cached.view();
  ops_.kv_read_keys(kv, batch.block_tables.front().data() + int64_t{seq} * batch.max_blocks_per_seq,
                    context, cached_view);
  FloatTensor keys({context, d.heads, d.qk});
  FloatTensor values({context, d.heads, d.v});
  Tensor latent =
      Tensor::strided(cached.data(), DType::kF32, {context, d.rank}, {d.latent_width(), 1});
  expand_keys_values(w, latent, cached.data() + d.rank, d.latent_width(), keys, values);
  PagedKvView expanded{keys.data(),
                       values.data(),
                       static_cast<int>(context),
                       static_cast<int>(d.heads),
                       static_cast<int>(d.qk),
                       static_cast<int>(d.v),
                       false};
  int32_t query_start[2] = {0, rows};
  int32_t block_table[1] = {0};
  AttentionBatch one{1, query_start, &context, block_table, 1, nullptr};
  Tensor q = Tensor::contiguous(s.q.data() + first_row * d.heads * d.qk, DType::kF32,
                                {rows, d.heads, d.qk});
  Tensor seq_out = Tensor::contiguous(out.as<float>() + first_row * d.heads * d.v, DType::kF32,
                                      {rows, d.heads, d.v});
  ops_.paged_attention(q, one, expanded, softmax_scale_, 0, seq_out);
}

// Short new chunks (decode): W_UK folds into the query and W_UV into the output, so attention
// runs over the cached latents directly as one shared 576-wide key/value head.
void DeepseekModel::attend_absorbed(const MlaWeights& w, const ForwardBatch& batch,
                                    const std::vector<int>& seqs, const PagedKvView& kv, Scratch& s,
                                    Tensor& out) {
  const MlaDims& d = dims_;
  std::vector<int32_t> rows, query_start{0}, context_lens, block_tables;
  for (int seq : seqs) {
    auto index = static_cast<size_t>(seq);
    for (int32_t r = batch.query_start[index]; r < batch.query_start[index + 1]; ++r)
      rows.push_back(r);
    query_start.push_back(static_cast<int32_t>(rows.size()));
    context_lens.push_back(batch.context_lens[index]);
    auto table = batch.block_tables.front().begin() + int64_t{seq} * batch.max_blocks_per_seq;
    block_tables.insert(block_tables.end(), table, table + batch.max_blocks_per_seq);
  }
  auto count = static_cast<int64_t>(rows.size());
  FloatTensor q({count, d.heads * d.qk});
  Tensor q_view = q.view();
  ops_.gather_rows(s.q.view(), rows, q_view);
  FloatTensor q_absorbed({count, d.heads, d.latent_width()});
  Tensor q_latent = Tensor::strided(q_absorbed.data(), DType::kF32, {count, d.heads, d.rank},
                                    {d.heads * d.latent_width(), d.latent_width(), 1});
  ops_.head_matmul(q_part(q, d, 0, d.nope), *w.kv_b_proj, {d.nope + d.v, 0, d.nope}, true,
                   q_latent);
  for (int64_t t = 0; t < count; ++t) {
    for (int64_t h = 0; h < d.heads; ++h) {
      std::copy_n(q.data() + (t * d.heads + h) * d.qk + d.nope, d.rope,
                  q_absorbed.data() + (t * d.heads + h) * d.latent_width() + d.rank);
    }
  }
  AttentionBatch sub{static_cast<int>(seqs.size()), query_start.data(),       context_lens.data(),
                     block_tables.data(),           batch.max_blocks_per_seq, nullptr};
  FloatTensor latent_out({count, d.heads, d.rank});
  Tensor latent_out_view = latent_out.view();
  ops_.paged_attention(q_absorbed.view(), sub, kv, softmax_scale_, 0, latent_out_view);
  FloatTensor heads_out({count, d.heads, d.v});
  Tensor heads_out_view = heads_out.view();
  ops_.head_matmul(latent_out_view, *w.kv_b_proj, {d.nope + d.v, d.nope, d.v}, false,
                   heads_out_view);
  for (int64_t t = 0; t < count; ++t) {
    std::copy_n(heads_out.data() + t * d.heads * d.v, d.heads * d.v,
                out.as<float>() + int64_t{rows[static_cast<size_t>(t)]} * d.heads * d.v);
  }
}

void DeepseekModel::attention_block(const DeepseekLayer& layer, int layer_index,
                                    const ForwardBatch& batch, KvCache& cache, Scratch& s,
                                    const float* cos, const float* sin) {
  const MlaDims& d = dims_;
  const MlaWeights& w = layer.attention;
  auto eps = static_cast<float>(config_.rms_norm_eps);
  int64_t tokens = batch.num_tokens();
  Tensor normed = s.normed.view();
  Tensor q = s.q.view();
  Tensor compressed_kv = s.compressed_kv.view();
  ops_.rmsnorm(s.hidden.view(), *layer.input_norm, eps, normed);
  if (w.q_a_proj) {
    Tensor q_compressed = s.q_compressed.view();
    ops_.matmuls(normed,
                 {{w.q_a_proj, nullptr, &q_compressed}, {w.kv_a_proj, nullptr, &compressed_kv}});
    ops_.rmsnorm(q_compressed, *w.q_a_norm, eps, q_compressed);
    ops_.matmul(q_compressed, *w.q_b_proj, nullptr, q);
  } else {
    ops_.matmuls(normed, {{w.q_proj, nullptr, &q}, {w.kv_a_proj, nullptr, &compressed_kv}});
  }
  Tensor latent =
      Tensor::strided(s.compressed_kv.data(), DType::kF32, {tokens, d.rank}, {d.latent_width(), 1});
  ops_.rmsnorm(latent, *w.kv_a_norm, eps, latent);
  Tensor rope_key = Tensor::strided(s.compressed_kv.data() + d.rank, DType::kF32,
                                    {tokens, 1, d.rope}, {d.latent_width(), d.rope, 1});
  ops_.rope(rope_key, cos, sin, static_cast<int>(d.rope), true);
  Tensor q_rope = q_part(s.q, d, d.nope, d.rope);
  ops_.rope(q_rope, cos, sin, static_cast<int>(d.rope), true);

  PagedKvView kv = cache.layer(layer_index);
  AttentionBatch view = batch.attention_view();
  Tensor out = Tensor::contiguous(s.attention.data(), DType::kF32, {tokens, d.heads, d.v});
  if (cache_form_ == MlaCache::kExpanded) {
    attend_expanded_cache(w, view, kv, s, out);
  } else {
    Tensor cached =
        Tensor::contiguous(s.compressed_kv.data(), DType::kF32, {tokens, 1, d.latent_width()});
    ops_.kv_write(cached, nullptr, view, kv);
    std::vector<int> absorbed;
    for (int seq = 0; seq < batch.num_seqs(); ++seq) {
      auto index = static_cast<size_t>(seq);
      int32_t rows = batch.query_start[index + 1] - batch.query_start[index];
      if (rows >= expand_min_tokens_) {
        attend_expanding_latents(w, batch, seq, kv, s, out);
      } else {
        absorbed.push_back(seq);
      }
    }
    if (!absorbed.empty()) attend_absorbed(w, batch, absorbed, kv, s, out);
  }
  ops_.matmul(s.attention.view(), *w.o_proj, nullptr, normed);
  Tensor hidden = s.hidden.view();
  ops_.add(hidden, normed);
}

void DeepseekModel::feed_forward(const DeepseekLayer& layer, Scratch& s) {
  Tensor normed = s.normed.view();
  ops_.rmsnorm(s.hidden.view(), *layer.post_attention_norm,
               static_cast<float>(config_.rms_norm_eps), normed);
  FloatTensor out({s.hidden.dim(0), s.hidden.dim(1)});
  Tensor out_view = out.view();
  if (layer.is_moe) {
    run_moe(ops_, config_.moe, layer.moe, normed, out_view);
  } else {
    run_gated_mlp(ops_, layer.mlp, normed, out_view);
  }
  Tensor hidden = s.hidden.view();
  ops_.add(hidden, out_view);
}

void DeepseekModel::forward(const ForwardBatch& batch, KvCache& cache, float* logits,
                            const HiddenStateSink& hidden_sink) {
  const ModelConfig& c = config_;
  int64_t tokens = batch.num_tokens();
  DI_CHECK(tokens > 0, "forward: empty batch");
  Scratch s(c, tokens);
  Tensor hidden = s.hidden.view();
  ops_.embedding(*embed_, batch.tokens.data(), hidden);
  if (hidden_sink) hidden_sink(0, hidden);
  std::vector<float> cos(static_cast<size_t>(tokens * dims_.rope / 2));
  std::vector<float> sin(cos.size());
  rope_.compute(batch.positions.data(), tokens, cos.data(), sin.data());
  for (int i = 0; i < c.num_layers; ++i) {
    const DeepseekLayer& layer = layers_[static_cast<size_t>(i)];
    attention_block(layer, i, batch, cache, s, cos.data(), sin.data());
    feed_forward(layer, s);
    if (hidden_sink && i + 1 < c.num_layers) hidden_sink(i + 1, hidden);
  }
  final_logits(ops_, batch, hidden, *final_norm_, *lm_head_, static_cast<float>(c.rms_norm_eps),
               c.num_layers, logits, hidden_sink);
}

}  // namespace

std::unique_ptr<CausalLM> make_deepseek_model(ModelConfig config,
                                              std::unique_ptr<TensorStore> store,
                                              const ModelLoadOptions& options, Ops& ops) {
  return std::make_unique<DeepseekModel>(std::move(config), std::move(store), options, ops);
}

}  // namespace deepinfer

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

// A multi-token-prediction module: the next token's embedding and the previous depth's
// hidden state, each normalised, joined by eh_proj, then one decoder layer and its own head.
struct MtpModule {
  DeepseekLayer layer;
  const Tensor* embed = nullptr;  // its own embedding, or the model's
  const Tensor* enorm = nullptr;
  const Tensor* hnorm = nullptr;
  const Tensor* eh_proj = nullptr;
  const Tensor* head_norm = nullptr;
  const Tensor* head = nullptr;  // its own head, or the model's lm_head
  std::map<std::string, const Tensor*> weights;
};

// Activations of one forward, sized for its token count.
struct Scratch {
  Scratch(Ops& ops, const ModelConfig& c, int64_t tokens)
      : hidden(ops, {tokens, c.hidden_size}),
        normed(ops, {tokens, c.hidden_size}),
        q_compressed(ops, {tokens, std::max(c.mla.q_lora_rank, 1)}),
        q(ops, {tokens, int64_t{c.num_heads} * c.mla.qk_head_dim()}),
        compressed_kv(ops, {tokens, int64_t{c.mla.kv_lora_rank} + c.mla.qk_rope_head_dim}),
        attention(ops, {tokens, int64_t{c.num_heads} * c.mla.v_head_dim}) {}
  BackendTensor hidden, normed, q_compressed, q, compressed_kv, attention;
};

// Views into MLA activations: rows of `width` floats holding per-head or latent parts.
struct MlaDims {
  int64_t heads, nope, rope, qk, v, rank;
  int64_t latent_width() const { return rank + rope; }  // one cached token (latent form)
};

Tensor q_part(const BackendTensor& q, const MlaDims& d, int64_t offset, int64_t width) {
  return Tensor::strided(q.data() + offset, DType::kF32, {q.dim(0), d.heads, width},
                         {d.heads * d.qk, d.qk, 1}, q.view().device);
}

// Small int arrays (one sequence's or a sub-batch's attention tables) where the kernels read
// them, packed into one copy.
class IntTables {
 public:
  IntTables(Ops& ops, std::initializer_list<const std::vector<int32_t>*> arrays) {
    std::vector<int32_t> packed;
    for (const std::vector<int32_t>* array : arrays) {
      offsets_.push_back(packed.size());
      packed.insert(packed.end(), array->begin(), array->end());
    }
    host_ = std::move(packed);
    base_ = static_cast<const int32_t*>(
        backend_copy(ops, host_.data(), host_.size() * sizeof(int32_t), memory_));
  }
  const int32_t* operator[](size_t index) const { return base_ + offsets_[index]; }

 private:
  std::vector<int32_t> host_;
  std::vector<size_t> offsets_;
  BackendMemory memory_;
  const int32_t* base_ = nullptr;
};

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
                          {},
                          ops_.kv_dtype()};
    }
    return KvCacheShape{config_.num_layers,
                        config_.num_heads,
                        static_cast<int>(dims_.qk),
                        static_cast<int>(dims_.v),
                        block_size,
                        false,
                        {},
                        ops_.kv_dtype()};
  }

  std::vector<const Tensor*> weights_read_per_token() const override;
  std::vector<const Tensor*> routed_weights_per_token() const override;

  // The expanded form prompts use: qk-wide scores and v-wide sums per head and context token.
  double attention_flops_per_token(double context) const override {
    return 2.0 * config_.num_layers * dims_.heads * (dims_.qk + dims_.v) * context;
  }

  void forward_into(const ForwardBatch& batch, KvCache& cache, Tensor& logits,
                    const HiddenStateSink& hidden_sink) override;

  KvCacheShape mtp_kv_shape(int block_size) const override {
    KvCacheShape shape = kv_shape(block_size);
    shape.num_layers = 1;
    return shape;
  }
  void mtp_forward(int index, const ForwardBatch& batch, const Tensor& previous, KvCache& cache,
                   Tensor& hidden, Tensor& logits) override;

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
                       const AttentionBatch& view, KvCache& cache, Scratch& s, const float* cos,
                       const float* sin);
  // A view of backend-memory floats.
  Tensor view(float* data, std::initializer_list<int64_t> shape,
              std::initializer_list<int64_t> strides) const {
    return Tensor::strided(data, DType::kF32, shape, strides, ops_.device());
  }
  void expand_keys_values(const MlaWeights& w, const Tensor& latent, const float* rope_keys,
                          int64_t rope_stride, BackendTensor& keys, BackendTensor& values);
  void attend_expanded_cache(const MlaWeights& w, const AttentionBatch& view, const PagedKvView& kv,
                             Scratch& s, Tensor& out);
  void attend_expanding_latents(const MlaWeights& w, const ForwardBatch& batch,
                                const AttentionBatch& view, int seq, const PagedKvView& kv,
                                Scratch& s, Tensor& out);
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
    layer.moe = bind_moe(ops_, store, prefix + "mlp.", c);
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
    module.enorm = layer_weight(store, prefix + "enorm.weight", {hidden});
    module.hnorm = layer_weight(store, prefix + "hnorm.weight", {hidden});
    module.eh_proj = layer_weight(store, prefix + "eh_proj.weight", {hidden, 2 * hidden});
    module.head_norm = layer_weight(store, prefix + "shared_head.norm.weight", {hidden});
    module.head =
        store.contains(prefix + "shared_head.head.weight")
            ? layer_weight(store, prefix + "shared_head.head.weight", {c.vocab_size, hidden})
            : lm_head_;
    module.embed = store.contains(prefix + "embed_tokens.weight")
                       ? layer_weight(store, prefix + "embed_tokens.weight", {c.vocab_size, hidden})
                       : embed_;
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
  }
  const std::vector<const Tensor*> routed = routed_weights_per_token();
  read.insert(read.end(), routed.begin(), routed.end());
  return read;
}

std::vector<const Tensor*> DeepseekModel::routed_weights_per_token() const {
  std::vector<const Tensor*> read;
  for (const DeepseekLayer& layer : layers_) {
    if (layer.is_moe) layer.moe.append_routed_weights(config_.moe.experts_per_token, read);
  }
  return read;
}

// keys [n, heads, qk] = [W_UK latent | rope key], values [n, heads, v] = W_UV latent.
void DeepseekModel::expand_keys_values(const MlaWeights& w, const Tensor& latent,
                                       const float* rope_keys, int64_t rope_stride,
                                       BackendTensor& keys, BackendTensor& values) {
  const MlaDims& d = dims_;
  int64_t n = latent.dim(0);
  BackendTensor expanded(ops_, {n, d.heads * (d.nope + d.v)});
  Tensor expanded_view = expanded.view();
  ops_.matmul(latent, *w.kv_b_proj, nullptr, expanded_view);
  int64_t row = d.heads * (d.nope + d.v);
  Tensor key_nope = view(keys.data(), {n, d.heads, d.nope}, {d.heads * d.qk, d.qk, 1});
  ops_.copy(view(expanded.data(), {n, d.heads, d.nope}, {row, d.nope + d.v, 1}), key_nope);
  // One rope key per token, repeated for every head (a source stride of 0).
  Tensor key_rope = view(keys.data() + d.nope, {n, d.heads, d.rope}, {d.heads * d.qk, d.qk, 1});
  ops_.copy(view(const_cast<float*>(rope_keys), {n, d.heads, d.rope}, {rope_stride, 0, 1}),
            key_rope);
  Tensor value_view = view(values.data(), {n, d.heads, d.v}, {d.heads * d.v, d.v, 1});
  ops_.copy(view(expanded.data() + d.nope, {n, d.heads, d.v}, {row, d.nope + d.v, 1}), value_view);
}

void DeepseekModel::attend_expanded_cache(const MlaWeights& w, const AttentionBatch& view_batch,
                                          const PagedKvView& kv, Scratch& s, Tensor& out) {
  const MlaDims& d = dims_;
  int64_t tokens = s.q.dim(0);
  BackendTensor keys(ops_, {tokens, d.heads, d.qk});
  BackendTensor values(ops_, {tokens, d.heads, d.v});
  Tensor latent = view(s.compressed_kv.data(), {tokens, d.rank}, {d.latent_width(), 1});
  expand_keys_values(w, latent, s.compressed_kv.data() + d.rank, d.latent_width(), keys, values);
  ops_.kv_write(keys.view(), &values.view(), view_batch, kv);
  Tensor q = view(s.q.data(), {tokens, d.heads, d.qk}, {d.heads * d.qk, d.qk, 1});
  ops_.paged_attention(q, view_batch, kv, softmax_scale_, 0, out);
}

// A long new chunk: expand every cached latent of the sequence into per-head keys and values
// (once per forward) and attend as plain multi-head attention.
void DeepseekModel::attend_expanding_latents(const MlaWeights& w, const ForwardBatch& batch,
                                             const AttentionBatch& view_batch, int seq,
                                             const PagedKvView& kv, Scratch& s, Tensor& out) {
  const MlaDims& d = dims_;
  auto index = static_cast<size_t>(seq);
  int32_t context = batch.context_lens[index];
  int32_t first_row = batch.query_start[index];
  int32_t rows = batch.query_start[index + 1] - first_row;
  BackendTensor cached(ops_, {context, d.latent_width()});
  Tensor cached_view = cached.view();
  ops_.kv_read_keys(kv, view_batch.block_tables + int64_t{seq} * view_batch.max_blocks_per_seq,
                    context, cached_view);
  BackendTensor keys(ops_, {context, d.heads, d.qk});
  BackendTensor values(ops_, {context, d.heads, d.v});
  Tensor latent = view(cached.data(), {context, d.rank}, {d.latent_width(), 1});
  expand_keys_values(w, latent, cached.data() + d.rank, d.latent_width(), keys, values);
  // The expanded keys as one block of `context` tokens.
  PagedKvView expanded{keys.data(),
                       values.data(),
                       static_cast<int>(context),
                       static_cast<int>(d.heads),
                       static_cast<int>(d.qk),
                       static_cast<int>(d.v),
                       false};
  std::vector<int32_t> query_start = {0, rows}, context_lens = {context}, block_table = {0};
  IntTables tables(ops_, {&query_start, &context_lens, &block_table});
  AttentionBatch one{1, tables[0], tables[1], tables[2], 1, nullptr, context};
  Tensor q = view(s.q.data() + first_row * d.heads * d.qk, {rows, d.heads, d.qk},
                  {d.heads * d.qk, d.qk, 1});
  Tensor seq_out = view(out.as<float>() + first_row * d.heads * d.v, {rows, d.heads, d.v},
                        {d.heads * d.v, d.v, 1});
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
  int64_t lw = d.latent_width();
  BackendTensor q(ops_, {count, d.heads * d.qk});
  Tensor q_view = q.view();
  ops_.gather_rows(s.q.view(), rows, q_view);
  BackendTensor q_absorbed(ops_, {count, d.heads, lw});
  Tensor q_latent = view(q_absorbed.data(), {count, d.heads, d.rank}, {d.heads * lw, lw, 1});
  ops_.head_matmul(q_part(q, d, 0, d.nope), *w.kv_b_proj, {d.nope + d.v, 0, d.nope}, true,
                   q_latent);
  Tensor q_rope = view(q_absorbed.data() + d.rank, {count, d.heads, d.rope}, {d.heads * lw, lw, 1});
  ops_.copy(q_part(q, d, d.nope, d.rope), q_rope);
  IntTables tables(ops_, {&query_start, &context_lens, &block_tables});
  AttentionBatch sub{static_cast<int>(seqs.size()), tables[0], tables[1], tables[2],
                     batch.max_blocks_per_seq,      nullptr};
  sub.max_context_len = *std::max_element(context_lens.begin(), context_lens.end());
  BackendTensor latent_out(ops_, {count, d.heads, d.rank});
  Tensor latent_out_view = latent_out.view();
  ops_.paged_attention(q_absorbed.view(), sub, kv, softmax_scale_, 0, latent_out_view);
  BackendTensor heads_out(ops_, {count, d.heads, d.v});
  Tensor heads_out_view = heads_out.view();
  ops_.head_matmul(latent_out_view, *w.kv_b_proj, {d.nope + d.v, d.nope, d.v}, false,
                   heads_out_view);
  // Back to the batch's rows, one copy per run of consecutive rows.
  int64_t width = d.heads * d.v;
  for (int64_t first = 0; first < count;) {
    int64_t last = first;
    while (last + 1 < count &&
           rows[static_cast<size_t>(last + 1)] == rows[static_cast<size_t>(last)] + 1)
      ++last;
    int64_t run = last - first + 1;
    Tensor target = view(out.as<float>() + int64_t{rows[static_cast<size_t>(first)]} * width,
                         {run, width}, {width, 1});
    ops_.copy(view(heads_out.data() + first * width, {run, width}, {width, 1}), target);
    first = last + 1;
  }
}

void DeepseekModel::attention_block(const DeepseekLayer& layer, int layer_index,
                                    const ForwardBatch& batch, const AttentionBatch& view_batch,
                                    KvCache& cache, Scratch& s, const float* cos,
                                    const float* sin) {
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
  Tensor latent = view(s.compressed_kv.data(), {tokens, d.rank}, {d.latent_width(), 1});
  ops_.rmsnorm(latent, *w.kv_a_norm, eps, latent);
  Tensor rope_key =
      view(s.compressed_kv.data() + d.rank, {tokens, 1, d.rope}, {d.latent_width(), d.rope, 1});
  ops_.rope(rope_key, cos, sin, static_cast<int>(d.rope), true);
  Tensor q_rope = q_part(s.q, d, d.nope, d.rope);
  ops_.rope(q_rope, cos, sin, static_cast<int>(d.rope), true);

  PagedKvView kv = cache.layer(layer_index);
  Tensor out = view(s.attention.data(), {tokens, d.heads, d.v}, {d.heads * d.v, d.v, 1});
  if (cache_form_ == MlaCache::kExpanded) {
    attend_expanded_cache(w, view_batch, kv, s, out);
  } else {
    Tensor cached = view(s.compressed_kv.data(), {tokens, 1, d.latent_width()},
                         {d.latent_width(), d.latent_width(), 1});
    ops_.kv_write(cached, nullptr, view_batch, kv);
    std::vector<int> absorbed;
    for (int seq = 0; seq < batch.num_seqs(); ++seq) {
      auto index = static_cast<size_t>(seq);
      int32_t rows = batch.query_start[index + 1] - batch.query_start[index];
      if (rows >= expand_min_tokens_) {
        attend_expanding_latents(w, batch, view_batch, seq, kv, s, out);
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
  BackendTensor out(ops_, {s.hidden.dim(0), s.hidden.dim(1)});
  Tensor out_view = out.view();
  if (layer.is_moe) {
    run_moe(ops_, config_.moe, layer.moe, normed, nullptr, out_view);
  } else {
    run_gated_mlp(ops_, layer.mlp, normed, out_view);
  }
  Tensor hidden = s.hidden.view();
  ops_.add(hidden, out_view);
}

void DeepseekModel::forward_into(const ForwardBatch& batch, KvCache& cache, Tensor& logits,
                                 const HiddenStateSink& hidden_sink) {
  const ModelConfig& c = config_;
  int64_t tokens = batch.num_tokens();
  DI_CHECK(tokens > 0, "forward: empty batch");
  Scratch s(ops_, c, tokens);
  BatchTables tables(ops_, batch);
  AttentionBatch view_batch = tables.attention(0);
  Tensor hidden = s.hidden.view();
  ops_.embedding(*embed_, tables.tokens(), hidden);
  report_hidden(ops_, hidden_sink, 0, hidden);
  std::vector<float> cos(static_cast<size_t>(tokens * dims_.rope / 2));
  std::vector<float> sin(cos.size());
  rope_.compute(batch.positions.data(), tokens, cos.data(), sin.data());
  BackendMemory cos_copy, sin_copy;
  const float* device_cos = backend_floats(ops_, cos, cos_copy);
  const float* device_sin = backend_floats(ops_, sin, sin_copy);
  for (int i = 0; i < c.num_layers; ++i) {
    const DeepseekLayer& layer = layers_[static_cast<size_t>(i)];
    attention_block(layer, i, batch, view_batch, cache, s, device_cos, device_sin);
    feed_forward(layer, s);
    if (i + 1 < c.num_layers) report_hidden(ops_, hidden_sink, i + 1, hidden);
  }
  final_logits(ops_, batch, hidden, *final_norm_, *lm_head_, static_cast<float>(c.rms_norm_eps),
               c.num_layers, logits, hidden_sink);
}

void DeepseekModel::mtp_forward(int index, const ForwardBatch& batch, const Tensor& previous,
                                KvCache& cache, Tensor& hidden, Tensor& logits) {
  DI_CHECK(index >= 0 && index < num_mtp_modules(), "MTP module {} does not exist", index);
  const MtpModule& module = mtp_[static_cast<size_t>(index)];
  const ModelConfig& c = config_;
  const int64_t tokens = batch.num_tokens(), width = c.hidden_size;
  DI_CHECK(tokens > 0 && previous.dim(0) == tokens && previous.dim(1) == width,
           "MTP forward: {} rows of previous hidden state for {} tokens", previous.dim(0), tokens);
  auto eps = static_cast<float>(c.rms_norm_eps);
  Scratch s(ops_, c, tokens);
  BatchTables tables(ops_, batch);
  AttentionBatch view_batch = tables.attention(0);
  // [enorm(embedding) | hnorm(previous)] through eh_proj.
  BackendTensor embedded(ops_, {tokens, width});
  Tensor embedded_view = embedded.view();
  ops_.embedding(*module.embed, tables.tokens(), embedded_view);
  BackendTensor joined(ops_, {tokens, 2 * width});
  Tensor first = view(joined.data(), {tokens, width}, {2 * width, 1});
  Tensor second = view(joined.data() + width, {tokens, width}, {2 * width, 1});
  Tensor normed = s.normed.view();
  ops_.rmsnorm(embedded_view, *module.enorm, eps, normed);
  ops_.copy(normed, first);
  ops_.rmsnorm(previous, *module.hnorm, eps, normed);
  ops_.copy(normed, second);
  Tensor state = s.hidden.view();
  ops_.matmul(joined.view(), *module.eh_proj, nullptr, state);
  std::vector<float> cos(static_cast<size_t>(tokens * dims_.rope / 2));
  std::vector<float> sin(cos.size());
  rope_.compute(batch.positions.data(), tokens, cos.data(), sin.data());
  BackendMemory cos_copy, sin_copy;
  attention_block(module.layer, 0, batch, view_batch, cache, s, backend_floats(ops_, cos, cos_copy),
                  backend_floats(ops_, sin, sin_copy));
  feed_forward(module.layer, s);
  ops_.copy(state, hidden);
  final_logits(ops_, batch, state, *module.head_norm, *module.head, eps, 1, logits, nullptr);
}

}  // namespace

std::unique_ptr<CausalLM> make_deepseek_model(ModelConfig config,
                                              std::unique_ptr<TensorStore> store,
                                              const ModelLoadOptions& options, Ops& ops) {
  return std::make_unique<DeepseekModel>(std::move(config), std::move(store), options, ops);
}

}  // namespace deepinfer

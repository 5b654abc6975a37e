// Llama, Mistral, Qwen2 and Qwen3: the dense decoder-only families.
#include <fmt/format.h>

#include <cmath>

#include "core/error.h"
#include "model/decode_graphs.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/rope.h"

namespace deepinfer {
namespace {

struct DenseLayer {
  const Tensor* input_norm = nullptr;
  const Tensor* q_proj = nullptr;
  const Tensor* k_proj = nullptr;
  const Tensor* v_proj = nullptr;
  const Tensor* o_proj = nullptr;
  const Tensor* q_bias = nullptr;
  const Tensor* k_bias = nullptr;
  const Tensor* v_bias = nullptr;
  const Tensor* o_bias = nullptr;
  const Tensor* q_norm = nullptr;
  const Tensor* k_norm = nullptr;
  const Tensor* post_attention_norm = nullptr;
  const Tensor* gate_proj = nullptr;
  const Tensor* up_proj = nullptr;
  const Tensor* down_proj = nullptr;
  const Tensor* gate_bias = nullptr;
  const Tensor* up_bias = nullptr;
  const Tensor* down_bias = nullptr;
  int rope_index = 0;
};

// Activations of one forward, sized for its token count.
struct Scratch {
  Scratch(Ops& ops, const ModelConfig& c, int64_t tokens)
      : hidden(ops, {tokens, c.hidden_size}),
        normed(ops, {tokens, c.hidden_size}),
        q(ops, {tokens, int64_t{c.num_heads} * c.head_dim}),
        k(ops, {tokens, int64_t{c.num_kv_heads} * c.head_dim}),
        v(ops, {tokens, int64_t{c.num_kv_heads} * c.head_dim}),
        attention(ops, {tokens, int64_t{c.num_heads} * c.head_dim}),
        gate(ops, {tokens, c.intermediate_size}),
        up(ops, {tokens, c.intermediate_size}) {}
  BackendTensor hidden, normed, q, k, v, attention, gate, up;
};

Tensor heads_view(const BackendTensor& tensor, int heads, int head_dim) {
  return Tensor::contiguous(tensor.data(), DType::kF32, {tensor.dim(0), heads, head_dim},
                            tensor.view().device);
}

class DenseTransformer final : public CausalLM {
 public:
  DenseTransformer(ModelConfig config, std::unique_ptr<TensorStore> store,
                   const ModelLoadOptions& options, Ops& ops)
      : config_(std::move(config)), store_(std::move(store)), ops_(ops) {
    if (options.record_decode_steps && ops.device() != Device::kCpu)
      graphs_ = std::make_unique<DecodeGraphs>(ops, config_.vocab_size);
    bind_weights();
    for (int layer = 0; layer < config_.num_layers; ++layer) {
      layers_[static_cast<size_t>(layer)].rope_index =
          rope_for(config_.layer_rope[static_cast<size_t>(layer)]);
    }
  }

  const ModelConfig& config() const override { return config_; }
  Ops& ops() const override { return ops_; }

  KvCacheShape kv_shape(int block_size) const override {
    KvCacheShape shape =
        KvCacheShape::heads(config_.num_layers, config_.num_kv_heads, config_.head_dim, block_size);
    shape.layer_window = config_.layer_window;  // sliding layers get their own cache group
    shape.dtype = ops_.kv_dtype();
    return shape;
  }

  int64_t replayed_decode_steps() const override { return graphs_ ? graphs_->replays() : 0; }
  std::vector<const Tensor*> weights_read_per_token() const override {
    std::vector<const Tensor*> read = {lm_head_, final_norm_};
    for (const auto& layer : layers_) {
      for (const Tensor* tensor :
           {layer.input_norm, layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj, layer.q_bias,
            layer.k_bias, layer.v_bias, layer.o_bias, layer.q_norm, layer.k_norm,
            layer.post_attention_norm, layer.gate_proj, layer.up_proj, layer.down_proj,
            layer.gate_bias, layer.up_bias, layer.down_bias}) {
        if (tensor) read.push_back(tensor);
      }
    }
    return read;
  }

  // Scores and the weighted sum of values: 2 FLOPs each per head dimension and context token.
  double attention_flops_per_token(double context) const override {
    return 4.0 * config_.num_layers * config_.num_heads * config_.head_dim * context;
  }

  void forward_into(const ForwardBatch& batch, KvCache& cache, Tensor& logits,
                    const HiddenStateSink& hidden_sink) override;

 private:
  const Tensor* weight(const std::string& name, std::initializer_list<int64_t> shape) {
    return layer_weight(*store_, name, shape);
  }
  const Tensor* optional(bool wanted, const std::string& name,
                         std::initializer_list<int64_t> shape) {
    return wanted ? weight(name, shape) : nullptr;
  }
  void bind_weights();
  int rope_for(const RopeConfig& rope);
  void attention_block(int layer_index, const ForwardInputs& inputs, KvCache& cache, Scratch& s);
  // cos then sin per rope configuration, [tokens, head_dim / 2] each, on the host.
  std::vector<std::vector<float>> rope_tables(const ForwardBatch& batch) const;
  // Embedding and every layer; hidden states to the sink when there is one.
  void run_layers(const ForwardInputs& inputs, KvCache& cache, Scratch& s,
                  const HiddenStateSink& hidden_sink);
  void mlp_block(const DenseLayer& layer, Scratch& s);

  ModelConfig config_;
  std::unique_ptr<TensorStore> store_;
  Ops& ops_;
  const Tensor* embed_ = nullptr;
  const Tensor* final_norm_ = nullptr;
  const Tensor* lm_head_ = nullptr;
  std::vector<DenseLayer> layers_;
  std::vector<RopeConfig> rope_configs_;
  std::vector<RotaryEmbedding> ropes_;
  std::unique_ptr<DecodeGraphs> graphs_;
};

void DenseTransformer::bind_weights() {
  const ModelConfig& c = config_;
  int64_t hidden = c.hidden_size;
  int64_t q_width = int64_t{c.num_heads} * c.head_dim;
  int64_t kv_width = int64_t{c.num_kv_heads} * c.head_dim;
  int64_t inter = c.intermediate_size;
  embed_ = weight("model.embed_tokens.weight", {c.vocab_size, hidden});
  final_norm_ = weight("model.norm.weight", {hidden});
  bool has_head = store_->contains("lm_head.weight");
  lm_head_ = (c.tie_word_embeddings && !has_head)
                 ? embed_
                 : weight("lm_head.weight", {c.vocab_size, hidden});
  for (int i = 0; i < c.num_layers; ++i) {
    std::string p = fmt::format("model.layers.{}.", i);
    DenseLayer layer;
    layer.input_norm = weight(p + "input_layernorm.weight", {hidden});
    layer.q_proj = weight(p + "self_attn.q_proj.weight", {q_width, hidden});
    layer.k_proj = weight(p + "self_attn.k_proj.weight", {kv_width, hidden});
    layer.v_proj = weight(p + "self_attn.v_proj.weight", {kv_width, hidden});
    layer.o_proj = weight(p + "self_attn.o_proj.weight", {hidden, q_width});
    layer.q_bias = optional(c.qkv_bias, p + "self_attn.q_proj.bias", {q_width});
    layer.k_bias = optional(c.qkv_bias, p + "self_attn.k_proj.bias", {kv_width});
    layer.v_bias = optional(c.qkv_bias, p + "self_attn.v_proj.bias", {kv_width});
    layer.o_bias = optional(c.o_bias, p + "self_attn.o_proj.bias", {hidden});
    layer.q_norm = optional(c.qk_norm, p + "self_attn.q_norm.weight", {c.head_dim});
    layer.k_norm = optional(c.qk_norm, p + "self_attn.k_norm.weight", {c.head_dim});
    layer.post_attention_norm = weight(p + "post_attention_layernorm.weight", {hidden});
    layer.gate_proj = weight(p + "mlp.gate_proj.weight", {inter, hidden});
    layer.up_proj = weight(p + "mlp.up_proj.weight", {inter, hidden});
    layer.down_proj = weight(p + "mlp.down_proj.weight", {hidden, inter});
    layer.gate_bias = optional(c.mlp_bias, p + "mlp.gate_proj.bias", {inter});
    layer.up_bias = optional(c.mlp_bias, p + "mlp.up_proj.bias", {inter});
    layer.down_bias = optional(c.mlp_bias, p + "mlp.down_proj.bias", {hidden});
    layers_.push_back(layer);
  }
}

int DenseTransformer::rope_for(const RopeConfig& rope) {
  // Layers that share a rope configuration share one cos/sin table per forward.
  for (size_t i = 0; i < rope_configs_.size(); ++i) {
    if (rope_configs_[i] == rope) return static_cast<int>(i);
  }
  rope_configs_.push_back(rope);
  ropes_.emplace_back(rope, config_.head_dim);
  return static_cast<int>(ropes_.size() - 1);
}

void DenseTransformer::attention_block(int layer_index, const ForwardInputs& inputs, KvCache& cache,
                                       Scratch& s) {
  const ModelConfig& c = config_;
  const DenseLayer& layer = layers_[static_cast<size_t>(layer_index)];
  Tensor normed = s.normed.view();
  Tensor q = s.q.view();
  Tensor k = s.k.view();
  Tensor v = s.v.view();
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const std::vector<MatmulJob> qkv = {{layer.q_proj, layer.q_bias, &q},
                                      {layer.k_proj, layer.k_bias, &k},
                                      {layer.v_proj, layer.v_bias, &v}};
  Tensor q_heads = heads_view(s.q, c.num_heads, c.head_dim);
  Tensor k_heads = heads_view(s.k, c.num_kv_heads, c.head_dim);
  Tensor v_heads = heads_view(s.v, c.num_kv_heads, c.head_dim);
  auto rope = static_cast<size_t>(layer.rope_index);
  const AttentionBatch& view = inputs.attention[static_cast<size_t>(
      cache.groups().layer_group[static_cast<size_t>(layer_index)])];
  PagedKvView kv = cache.layer(layer_index);
  if (layer.q_norm) {  // per-head norms between the products and rope (Qwen3)
    ops_.norm_matmuls(s.hidden.view(), *layer.input_norm, eps, normed, qkv);
    ops_.rmsnorm(q_heads, *layer.q_norm, eps, q_heads);
    ops_.rmsnorm(k_heads, *layer.k_norm, eps, k_heads);
    ops_.rope_kv_write(q_heads, k_heads, v_heads, inputs.cos[rope], inputs.sin[rope], c.head_dim,
                       view, kv);
  } else {
    ops_.norm_qkv_rope_write(s.hidden.view(), *layer.input_norm, eps, normed, qkv, q_heads, k_heads,
                             v_heads, inputs.cos[rope], inputs.sin[rope], c.head_dim, view, kv);
  }
  Tensor attention = heads_view(s.attention, c.num_heads, c.head_dim);
  float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  ops_.paged_attention(q_heads, view, kv, scale, c.layer_window[static_cast<size_t>(layer_index)],
                       attention);
  Tensor hidden = s.hidden.view();
  ops_.matmul_add(s.attention.view(), *layer.o_proj, layer.o_bias, normed, hidden);
}

void DenseTransformer::mlp_block(const DenseLayer& layer, Scratch& s) {
  Tensor normed = s.normed.view();
  Tensor gate = s.gate.view();
  Tensor up = s.up.view();
  Tensor hidden = s.hidden.view();
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  const MatmulJob gate_job{layer.gate_proj, layer.gate_bias, &gate};
  const MatmulJob up_job{layer.up_proj, layer.up_bias, &up};
  if (config_.activation == Activation::kSilu) {
    ops_.norm_silu_gate(hidden, *layer.post_attention_norm, eps, normed, gate_job, up_job, gate);
  } else {
    ops_.norm_matmuls(hidden, *layer.post_attention_norm, eps, normed, {gate_job, up_job});
    ops_.gelu_tanh_mul(gate, up, gate);
  }
  ops_.matmul_add(gate, *layer.down_proj, layer.down_bias, normed, hidden);
}

std::vector<std::vector<float>> DenseTransformer::rope_tables(const ForwardBatch& batch) const {
  std::vector<std::vector<float>> tables;
  int64_t tokens = batch.num_tokens();
  auto size = static_cast<size_t>(tokens) * static_cast<size_t>(config_.head_dim / 2);
  for (const RotaryEmbedding& rope : ropes_) {
    std::vector<float> cos(size), sin(size);
    rope.compute(batch.positions.data(), tokens, cos.data(), sin.data());
    tables.push_back(std::move(cos));
    tables.push_back(std::move(sin));
  }
  return tables;
}

void DenseTransformer::run_layers(const ForwardInputs& inputs, KvCache& cache, Scratch& s,
                                  const HiddenStateSink& hidden_sink) {
  Tensor hidden = s.hidden.view();
  ops_.embedding(*embed_, inputs.token_ids, hidden);
  report_hidden(ops_, hidden_sink, 0, hidden);
  for (int i = 0; i < config_.num_layers; ++i) {
    attention_block(i, inputs, cache, s);
    mlp_block(layers_[static_cast<size_t>(i)], s);
    if (i + 1 < config_.num_layers) report_hidden(ops_, hidden_sink, i + 1, hidden);
  }
}

void DenseTransformer::forward_into(const ForwardBatch& batch, KvCache& cache, Tensor& logits,
                                    const HiddenStateSink& hidden_sink) {
  const ModelConfig& c = config_;
  int64_t tokens = batch.num_tokens();
  DI_CHECK(tokens > 0, "forward: empty batch");
  auto eps = static_cast<float>(c.rms_norm_eps);
  std::vector<std::vector<float>> rope = rope_tables(batch);
  if (!hidden_sink && graphs_ && graphs_->eligible(batch)) {
    auto body = [&](const ForwardInputs& inputs, Tensor& out) {
      Scratch s(ops_, c, tokens);
      run_layers(inputs, cache, s, nullptr);
      decode_logits(ops_, s.hidden.view(), *final_norm_, *lm_head_, eps, out);
    };
    if (graphs_->run(batch, cache, rope, {}, logits, body)) return;
  }
  BatchTables tables(ops_, batch);
  ForwardInputs inputs;
  inputs.token_ids = tables.tokens();
  for (int g = 0; g < cache.groups().num_groups(); ++g)
    inputs.attention.push_back(tables.attention(g));
  std::vector<BackendMemory> copies(rope.size());
  for (size_t r = 0; r < rope.size(); r += 2) {
    inputs.cos.push_back(backend_floats(ops_, rope[r], copies[r]));
    inputs.sin.push_back(backend_floats(ops_, rope[r + 1], copies[r + 1]));
  }
  Scratch s(ops_, c, tokens);
  run_layers(inputs, cache, s, hidden_sink);
  final_logits(ops_, batch, s.hidden.view(), *final_norm_, *lm_head_, eps, c.num_layers, logits,
               hidden_sink);
}

}  // namespace

std::unique_ptr<CausalLM> make_dense_model(ModelConfig config, std::unique_ptr<TensorStore> store,
                                           const ModelLoadOptions& options, Ops& ops) {
  return std::make_unique<DenseTransformer>(std::move(config), std::move(store), options, ops);
}

}  // namespace deepinfer

// DeepSeek-V4: hybrid sliding-window and compressed attention, hyper-connections, and
// hash-routed mixture of experts. Weights load under transformers' names and DeepSeek's own.
#include "model/deepseek_v4.h"

#include <fmt/format.h>

#include <memory>
#include <numeric>

#include "core/error.h"
#include "model/decode_graphs.h"
#include "model/layers.h"

namespace deepinfer {
namespace v4 {

CacheLayout CacheLayout::of(const ModelConfig& config) {
  const DeepseekV4Config& v4 = config.v4;
  CacheLayout layout;
  layout.row = config.head_dim;
  auto layers = static_cast<size_t>(config.num_layers);
  layout.window_layer.resize(layers);
  layout.input_layer.assign(layers, -1);
  layout.input_width.assign(layers, 0);
  layout.stripe_offset.assign(layers, 0);
  layout.stripe_width.assign(layers, 0);
  auto add_layers = [&](int64_t width, int window) {
    int first = layout.num_cache_layers();
    for (int64_t i = 0; i < (width + layout.row - 1) / layout.row; ++i)
      layout.cache_layer_window.push_back(window);
    return first;
  };
  for (size_t l = 0; l < layers; ++l) layout.window_layer[l] = add_layers(layout.row, v4.window);
  for (size_t l = 0; l < layers; ++l) {
    V4Attention kind = v4.layer_attention[l];
    if (kind == V4Attention::kSliding) continue;
    int rate = v4.layer_rate[l];
    bool sparse = kind == V4Attention::kCompressedSparse;
    int64_t hd = config.head_dim, index_dim = sparse ? v4.index_head_dim : 0;
    // Values and gates per token: twice the entry width for the overlapping compressors.
    layout.input_width[l] = sparse ? 4 * (hd + index_dim) : 2 * hd;
    // An open window reaches back `rate` tokens, CSA's overlap one window more.
    layout.input_layer[l] = add_layers(layout.input_width[l], sparse ? 2 * rate : rate);
    int64_t entry = hd + index_dim;
    layout.stripe_width[l] = (entry + rate - 1) / rate;
    layout.stripe_offset[l] = layout.entry_record_width;
    layout.entry_record_width += layout.stripe_width[l];
  }
  layout.first_entry_layer = add_layers(layout.entry_record_width, 0);
  return layout;
}

}  // namespace v4

namespace {

using namespace v4;

// The first of `names` the checkpoint has (transformers' spelling, then DeepSeek's).
std::string present(const TensorStore& store, std::initializer_list<std::string> names) {
  for (const std::string& name : names) {
    if (store.contains(name)) return name;
  }
  std::string listed;
  for (const std::string& name : names) listed += (listed.empty() ? "\"" : " or \"") + name + "\"";
  fail("checkpoint has no tensor {}", listed);
}

class DeepseekV4Model final : public CausalLM {
 public:
  DeepseekV4Model(ModelConfig config, std::unique_ptr<TensorStore> store,
                  const ModelLoadOptions& options, Ops& ops)
      : config_(std::move(config)),
        store_(std::move(store)),
        ops_(ops),
        layout_(CacheLayout::of(config_)) {
    if (options.record_decode_steps && ops.device() != Device::kCpu) {
      // The indexer and sparse attention size their work by the context bound a recording
      // is made for, so it must cover every context it replays.
      graphs_ = std::make_unique<DecodeGraphs>(ops, config_.vocab_size,
                                               DecodeGraphs::ContextBound::kCovering);
    }
    for (int rate : config_.v4.layer_rate) {
      if (rate > 0) block_multiple_ = std::lcm(block_multiple_, rate);
      constexpr int kMaxBlock = 1 << 16;
      if (block_multiple_ > kMaxBlock)
        fail("{}: compression rates need KV blocks of {} tokens (whole windows; at most {})",
             config_.architecture, block_multiple_, kMaxBlock);
    }
    bind_weights();
    std::vector<float> ones(static_cast<size_t>(config_.head_dim), 1.0f);
    ones_ = BackendTensor(ops_, {config_.head_dim});
    ops_.to_backend(ones_.data(), ones.data(), ones.size() * sizeof(float));
  }

  const ModelConfig& config() const override { return config_; }
  Ops& ops() const override { return ops_; }

  // A block holds whole compression windows: the requested size rounded up to a multiple of
  // every compression rate.
  KvCacheShape kv_shape(int block_size) const override {
    DI_CHECK(block_size > 0, "KV block size must be positive");
    int rounded = (block_size + block_multiple_ - 1) / block_multiple_ * block_multiple_;
    return KvCacheShape{
        layout_.num_cache_layers(), 1,          layout_.row, layout_.row, rounded, true,
        layout_.cache_layer_window, DType::kF32};  // f32 on every backend so far
  }

  int64_t replayed_decode_steps() const override { return graphs_ ? graphs_->replays() : 0; }
  // Every layer keeps a window of K=V rows; a CSA compressor's overlapping windows also read
  // the `rate` inputs before a block boundary, which a replay must rebuild.
  ReplayBounds replay_bounds() const override {
    const int64_t window = config_.v4.window;
    int64_t overlap = 1;
    for (const LayerWeights& layer : layers_)
      if (layer.attention.compressor.overlapping) overlap = std::max<int64_t>(overlap, layer.rate);
    return {window, overlap, std::max(window, overlap) * static_cast<int64_t>(layers_.size())};
  }
  std::vector<const Tensor*> weights_read_per_token() const override;
  std::vector<const Tensor*> routed_weights_per_token() const override;
  double attention_flops_per_token(double context) const override;
  void forward_into(const ForwardBatch& batch, KvCache& cache, Tensor& logits,
                    const HiddenStateSink& hidden_sink) override;

  int num_mtp_modules() const override { return static_cast<int>(mtp_.size()); }
  std::map<std::string, const Tensor*> mtp_module_weights(int index) const override {
    DI_CHECK(index >= 0 && index < num_mtp_modules(), "MTP module {} does not exist", index);
    return mtp_[static_cast<size_t>(index)];
  }

 private:
  void bind_weights();
  // The layers and the final head collapse of a forward: `collapsed` [T, D] ends as the
  // hidden state the final norm reads.
  void run_layers(ForwardContext& forward, KvCache& cache, const HiddenStateSink& hidden_sink,
                  Tensor& collapsed);
  LayerWeights bind_layer(const std::string& prefix, int index);
  AttentionWeights bind_attention(const std::string& prefix, const LayerWeights& layer);
  CompressorWeights bind_compressor(const std::string& prefix, int width, int rate,
                                    bool overlapping);
  MoeWeights bind_moe(const std::string& prefix, bool hash_routed);
  std::vector<int32_t> token_expert_table(const std::string& name);
  BackendTensor f32_tensor(const std::string& name, std::initializer_list<int64_t> shape);
  HyperConnectionWeights bind_hc(const std::string& fn, const std::string& base,
                                 const std::string& scale, int64_t mixes, int64_t scales);
  HyperConnection site(const HyperConnectionWeights& w) const;
  Tensor weight_rows(const Tensor& weight, const std::string& name, int64_t first, int64_t rows);

  ModelConfig config_;
  std::unique_ptr<TensorStore> store_;
  Ops& ops_;
  CacheLayout layout_;
  int block_multiple_ = 1;
  const Tensor* embed_ = nullptr;
  const Tensor* final_norm_ = nullptr;
  const Tensor* lm_head_ = nullptr;
  HyperConnectionWeights head_hc_;
  BackendTensor ones_;  // [hd]: the weight of unweighted per-head norms
  std::vector<LayerWeights> layers_;
  std::vector<std::unique_ptr<BlockScales>> row_scales_;  // of weight_rows views
  std::vector<std::map<std::string, const Tensor*>> mtp_;
  std::unique_ptr<DecodeGraphs> graphs_;
};

// The tensor `name` widened to f32 in backend memory.
BackendTensor DeepseekV4Model::f32_tensor(const std::string& name,
                                          std::initializer_list<int64_t> shape) {
  std::vector<float> values = host_floats(ops_, *store_, name, shape);
  BackendTensor tensor(ops_, shape);
  ops_.to_backend(tensor.data(), values.data(), values.size() * sizeof(float));
  return tensor;
}

HyperConnectionWeights DeepseekV4Model::bind_hc(const std::string& fn, const std::string& base,
                                                const std::string& scale, int64_t mixes,
                                                int64_t scales) {
  int64_t width = int64_t{config_.v4.hc_mult} * config_.hidden_size;
  return {f32_tensor(fn, {mixes, width}), f32_tensor(base, {mixes}), f32_tensor(scale, {scales})};
}

HyperConnection DeepseekV4Model::site(const HyperConnectionWeights& w) const {
  const DeepseekV4Config& v4 = config_.v4;
  return {&w.fn.view(),
          &w.base.view(),
          &w.scale.view(),
          v4.hc_mult,
          v4.hc_sinkhorn_iters,
          static_cast<float>(v4.hc_eps),
          static_cast<float>(config_.rms_norm_eps)};
}

// Rows [first, first + rows) of a weight, sharing its storage (and block scales).
Tensor DeepseekV4Model::weight_rows(const Tensor& weight, const std::string& name, int64_t first,
                                    int64_t rows) {
  Tensor view = weight;
  view.shape[0] = rows;
  view.data = static_cast<char*>(weight.data) +
              static_cast<size_t>(first * weight.strides[0]) * dtype_size(weight.dtype);
  if (weight.block_scales) {
    const BlockScales& scales = *weight.block_scales;
    if (first % scales.block_rows != 0)
      fail("tensor \"{}\": output group rows {} are not a multiple of the scale block {}", name,
           first, scales.block_rows);
    auto sliced = std::make_unique<BlockScales>(scales);
    sliced->data += first / scales.block_rows * scales.cols;
    sliced->rows = (rows + scales.block_rows - 1) / scales.block_rows;
    view.block_scales = sliced.get();
    row_scales_.push_back(std::move(sliced));
  }
  return view;
}

CompressorWeights DeepseekV4Model::bind_compressor(const std::string& prefix, int width, int rate,
                                                   bool overlapping) {
  CompressorWeights c;
  c.width = width;
  c.overlapping = overlapping;
  int64_t projected = c.projected(), hidden = config_.hidden_size;
  c.values = layer_weight(*store_, prefix + "wkv.weight", {projected, hidden});
  c.gates = layer_weight(*store_, prefix + "wgate.weight", {projected, hidden});
  c.position_bias = f32_tensor(prefix + "ape", {rate, projected});
  c.norm = f32_tensor(prefix + "norm.weight", {width});
  return c;
}

AttentionWeights DeepseekV4Model::bind_attention(const std::string& prefix,
                                                 const LayerWeights& layer) {
  const ModelConfig& c = config_;
  const DeepseekV4Config& v4 = c.v4;
  const TensorStore& store = *store_;
  int64_t hidden = c.hidden_size, hd = c.head_dim, heads = c.num_heads, rank = v4.q_lora_rank;
  std::string p = prefix + "attn.";
  AttentionWeights a;
  a.q_down = layer_weight(store, p + "wq_a.weight", {rank, hidden});
  a.q_norm = layer_weight(store, p + "q_norm.weight", {rank});
  a.q_up = layer_weight(store, p + "wq_b.weight", {heads * hd, rank});
  a.kv = layer_weight(store, p + "wkv.weight", {hd, hidden});
  a.kv_norm = layer_weight(store, present(store, {p + "norm.weight", p + "kv_norm.weight"}), {hd});
  a.sinks = f32_tensor(p + "attn_sink", {heads});
  int64_t groups = v4.o_groups, out_rank = v4.o_lora_rank;
  const Tensor* out_down =
      layer_weight(store, p + "wo_a.weight", {groups * out_rank, heads * hd / groups});
  for (int64_t g = 0; g < groups; ++g)
    a.out_groups.push_back(weight_rows(*out_down, p + "wo_a.weight", g * out_rank, out_rank));
  a.out_mix = layer_weight(store, p + "wo_b.weight", {hidden, groups * out_rank});
  if (layer.kind == V4Attention::kSliding) return a;
  bool sparse = layer.kind == V4Attention::kCompressedSparse;
  a.compressor = bind_compressor(p + "compressor.", c.head_dim, layer.rate, sparse);
  if (!sparse) return a;
  int64_t index_heads = v4.index_heads, index_dim = v4.index_head_dim;
  a.index_compressor =
      bind_compressor(p + "indexer.compressor.", v4.index_head_dim, layer.rate, true);
  a.index_q_up = layer_weight(store, p + "indexer.wq_b.weight", {index_heads * index_dim, rank});
  a.index_weights = layer_weight(store, p + "indexer.weights_proj.weight", {index_heads, hidden});
  return a;
}

MoeWeights DeepseekV4Model::bind_moe(const std::string& prefix, bool hash_routed) {
  const MoeConfig& moe = config_.moe;
  const TensorStore& store = *store_;
  int64_t hidden = config_.hidden_size, width = moe.expert_intermediate_size;
  std::string p = prefix + "ffn.";
  MoeWeights m;
  m.routed.routing = expert_routing(moe);
  m.router = layer_weight(store, p + "gate.weight", {moe.num_experts, hidden});
  auto bind_expert = [&](const std::string& name, int64_t intermediate) {
    return GatedMlp{layer_weight(store, name + "w1.weight", {intermediate, hidden}),
                    layer_weight(store, name + "w3.weight", {intermediate, hidden}),
                    layer_weight(store, name + "w2.weight", {hidden, intermediate})};
  };
  for (int e = 0; e < moe.num_experts; ++e) {
    GatedMlp expert = bind_expert(fmt::format("{}experts.{}.", p, e), width);
    m.routed.gate.push_back(expert.gate);
    m.routed.up.push_back(expert.up);
    m.routed.down.push_back(expert.down);
  }
  std::string shared = p + "shared_experts.";
  if (store.contains(shared + "w1.weight"))  // its width is whatever the checkpoint stores
    m.shared = bind_expert(shared, store.get(shared + "w1.weight").dim(0));
  if (!hash_routed) {
    // The selection bias steers the choice only, as V3's correction bias does.
    m.routed.correction_bias = host_floats(ops_, store, p + "gate.bias", {moe.num_experts});
    return m;
  }
  m.routed.token_experts = token_expert_table(p + "gate.tid2eid");
  return m;
}

// tid2eid: each token id's experts, checked to name existing ones.
std::vector<int32_t> DeepseekV4Model::token_expert_table(const std::string& name) {
  const MoeConfig& moe = config_.moe;
  const Tensor& table = store_->get(name, {config_.vocab_size, moe.experts_per_token});
  if (table.dtype != DType::kI64 && table.dtype != DType::kI32)
    fail("tensor \"{}\" has dtype {}; expected I64 or I32", name, dtype_name(table.dtype));
  std::vector<std::byte> raw(table.nbytes());
  ops_.to_host(raw.data(), table.data, raw.size());
  std::vector<int32_t> experts;
  for (int64_t i = 0; i < table.numel(); ++i) {
    int64_t expert = 0;
    if (table.dtype == DType::kI64) {
      std::memcpy(&expert, raw.data() + i * 8, 8);
    } else {
      int32_t narrow = 0;
      std::memcpy(&narrow, raw.data() + i * 4, 4);
      expert = narrow;
    }
    if (expert < 0 || expert >= moe.num_experts)
      fail("tensor \"{}\" names expert {} of {}", name, expert, moe.num_experts);
    experts.push_back(static_cast<int32_t>(expert));
  }
  return experts;
}

LayerWeights DeepseekV4Model::bind_layer(const std::string& prefix, int index) {
  const DeepseekV4Config& v4 = config_.v4;
  auto l = static_cast<size_t>(index);
  int64_t hidden = config_.hidden_size, streams = v4.hc_mult;
  LayerWeights layer;
  layer.kind = v4.layer_attention[l];
  layer.rate = v4.layer_rate[l];
  layer.hash_routed = v4.layer_hash[l];
  layer.attention_norm = layer_weight(*store_, prefix + "attn_norm.weight", {hidden});
  layer.ffn_norm = layer_weight(*store_, prefix + "ffn_norm.weight", {hidden});
  int64_t mixes = (2 + streams) * streams;
  layer.attention_hc =
      bind_hc(prefix + "hc_attn_fn", prefix + "hc_attn_base", prefix + "hc_attn_scale", mixes, 3);
  layer.ffn_hc =
      bind_hc(prefix + "hc_ffn_fn", prefix + "hc_ffn_base", prefix + "hc_ffn_scale", mixes, 3);
  layer.attention = bind_attention(prefix, layer);
  layer.moe = bind_moe(prefix, layer.hash_routed);
  return layer;
}

void DeepseekV4Model::bind_weights() {
  const ModelConfig& c = config_;
  const TensorStore& store = *store_;
  int64_t hidden = c.hidden_size;
  // transformers saves the model-level tensors under "model."; DeepSeek's files do not.
  bool hf = store.contains("model.embed_tokens.weight");
  embed_ = layer_weight(store, hf ? "model.embed_tokens.weight" : "embed.weight",
                        {c.vocab_size, hidden});
  final_norm_ = layer_weight(store, hf ? "model.norm.weight" : "norm.weight", {hidden});
  lm_head_ = layer_weight(store, present(store, {"head.weight", "lm_head.weight"}),
                          {c.vocab_size, hidden});
  head_hc_ = hf ? bind_hc("model.hc_head.hc_fn", "model.hc_head.hc_base", "model.hc_head.hc_scale",
                          c.v4.hc_mult, 1)
                : bind_hc("hc_head_fn", "hc_head_base", "hc_head_scale", c.v4.hc_mult, 1);
  for (int i = 0; i < c.num_layers; ++i)
    layers_.push_back(bind_layer((hf ? "model.layers." : "layers.") + std::to_string(i) + ".", i));
  // MTP modules (DeepSeek's files; transformers does not save them) for speculative decoding.
  for (int m = 0; m < c.num_mtp_layers; ++m) {
    std::string prefix = fmt::format("mtp.{}.", m);
    std::map<std::string, const Tensor*> weights;
    for (const std::string& name : store.names()) {
      if (name.rfind(prefix, 0) == 0) weights[name.substr(prefix.size())] = &store.get(name);
    }
    if (!weights.empty()) mtp_.push_back(std::move(weights));
  }
}

std::vector<const Tensor*> DeepseekV4Model::weights_read_per_token() const {
  std::vector<const Tensor*> read = {lm_head_, final_norm_};
  for (const LayerWeights& layer : layers_) {
    const AttentionWeights& a = layer.attention;
    for (const Tensor* tensor :
         {layer.attention_norm, layer.ffn_norm, a.q_down, a.q_norm, a.q_up, a.kv, a.kv_norm,
          a.out_mix, a.compressor.values, a.compressor.gates, a.index_compressor.values,
          a.index_compressor.gates, a.index_q_up, a.index_weights, layer.moe.router}) {
      if (tensor) read.push_back(tensor);
    }
    for (const Tensor& group : a.out_groups) read.push_back(&group);
    const GatedMlp& shared = layer.moe.shared;
    if (shared.gate) read.insert(read.end(), {shared.gate, shared.up, shared.down});
  }
  const std::vector<const Tensor*> routed = routed_weights_per_token();
  read.insert(read.end(), routed.begin(), routed.end());
  return read;
}

std::vector<const Tensor*> DeepseekV4Model::routed_weights_per_token() const {
  std::vector<const Tensor*> read;
  for (const LayerWeights& layer : layers_)
    layer.moe.append_routed_weights(config_.moe.experts_per_token, read);
  return read;
}

double DeepseekV4Model::attention_flops_per_token(double context) const {
  const DeepseekV4Config& v4 = config_.v4;
  double per_key = 4.0 * config_.num_heads * config_.head_dim;  // scores and sums
  double flops = 0.0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    double keys = std::min<double>(v4.window, context);
    int rate = v4.layer_rate[l];
    if (v4.layer_attention[l] == V4Attention::kCompressedSparse) {
      keys += std::min<double>(v4.index_topk, context / rate);
      flops += 2.0 * v4.index_heads * v4.index_head_dim * context / rate;
    } else if (rate > 0) {
      keys += context / rate;
    }
    flops += per_key * keys;
  }
  return flops;
}

void DeepseekV4Model::run_layers(ForwardContext& forward, KvCache& cache,
                                 const HiddenStateSink& hidden_sink, Tensor& collapsed) {
  const ModelConfig& c = config_;
  const int64_t tokens = forward.batch.num_tokens();
  const int64_t hidden = c.hidden_size, streams = c.v4.hc_mult;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  BackendTensor normed(ops_, {tokens, hidden}), out(ops_, {tokens, hidden});
  BackendTensor residual(ops_, {tokens, streams * hidden});
  BackendTensor mix(ops_, {tokens, (2 + streams) * streams});
  Tensor normed_view = normed.view(), out_view = out.view();
  Tensor residual_view = residual.view(), mix_view = mix.view();
  ops_.embedding(*embed_, forward.token_ids, collapsed);
  report_hidden(ops_, hidden_sink, 0, collapsed);
  // Every residual stream starts as the embedding.
  Tensor copies = Tensor::strided(residual.data(), DType::kF32, {tokens, streams, hidden},
                                  {streams * hidden, hidden, 1}, ops_.device());
  ops_.copy(Tensor::strided(collapsed.data, DType::kF32, {tokens, streams, hidden}, {hidden, 0, 1},
                            ops_.device()),
            copies);
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerWeights& layer = layers_[static_cast<size_t>(i)];
    ops_.hc_pre(residual_view, site(layer.attention_hc), &mix_view, collapsed);
    ops_.rmsnorm(collapsed, *layer.attention_norm, eps, normed_view);
    run_attention(ops_, c, layout_, layer, i, forward, cache, ones_.view(), normed_view, out_view);
    ops_.hc_post(out_view, mix_view, residual_view);
    ops_.hc_pre(residual_view, site(layer.ffn_hc), &mix_view, collapsed);
    ops_.rmsnorm(collapsed, *layer.ffn_norm, eps, normed_view);
    run_moe(ops_, c.moe, layer.moe, normed_view, forward.token_ids, out_view);
    ops_.hc_post(out_view, mix_view, residual_view);
    // A layer's output is its residual streams, [T, hc_mult * hidden].
    if (i + 1 < c.num_layers) report_hidden(ops_, hidden_sink, i + 1, residual_view);
  }
  ops_.hc_pre(residual_view, site(head_hc_), nullptr, collapsed);
}

void DeepseekV4Model::forward_into(const ForwardBatch& batch, KvCache& cache, Tensor& logits,
                                   const HiddenStateSink& hidden_sink) {
  const ModelConfig& c = config_;
  const int64_t tokens = batch.num_tokens();
  DI_CHECK(tokens > 0, "forward: empty batch");
  const auto eps = static_cast<float>(c.rms_norm_eps);
  if (!hidden_sink && graphs_ && graphs_->eligible(batch)) {
    StepTables host = StepTables::of(c, batch, true);
    auto body = [&](const ForwardInputs& inputs, Tensor& out) {
      ForwardContext forward(c, batch, inputs);
      BackendTensor collapsed(ops_, {tokens, c.hidden_size});
      Tensor collapsed_view = collapsed.view();
      run_layers(forward, cache, nullptr, collapsed_view);
      decode_logits(ops_, collapsed_view, *final_norm_, *lm_head_, eps, out);
    };
    if (graphs_->run(batch, cache, host.rope, host.windows, logits, body)) return;
  }
  ForwardContext forward(ops_, c, batch);
  BackendTensor collapsed(ops_, {tokens, c.hidden_size});
  Tensor collapsed_view = collapsed.view();
  run_layers(forward, cache, hidden_sink, collapsed_view);
  final_logits(ops_, batch, collapsed_view, *final_norm_, *lm_head_, eps, c.num_layers, logits,
               hidden_sink);
}

}  // namespace

std::unique_ptr<CausalLM> make_deepseek_v4_model(ModelConfig config,
                                                 std::unique_ptr<TensorStore> store,
                                                 const ModelLoadOptions& options, Ops& ops) {
  return std::make_unique<DeepseekV4Model>(std::move(config), std::move(store), options, ops);
}

}  // namespace deepinfer

// Causal language models over a flattened batch of sequences.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "kv/kv_cache.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace deepinfer {

// One step's work for the model: the new tokens of several sequences laid end to end.
struct ForwardBatch {
  std::vector<int32_t> tokens;     // [T]
  std::vector<int32_t> positions;  // [T]
  std::vector<int32_t> query_start{0};
  std::vector<int32_t> context_lens;
  // Per KV cache group (KvGroupLayout): block tables [sequences, max_blocks_per_seq] padded
  // with the null block, and each token's cache slot [T].
  std::vector<std::vector<int32_t>> block_tables;
  int max_blocks_per_seq = 0;
  std::vector<std::vector<int64_t>> slot_mapping;
  // Per sequence, from its PrefixReplay: where its sliding windows start, and the end of the
  // restored KV the forward must not write (DeepSeek-V4 pools no window that ends before it).
  std::vector<int32_t> first_positions;
  std::vector<int32_t> restored_ends;
  // Rows of the batch whose logits are wanted, in output order.
  std::vector<int32_t> logit_rows;

  // Appends a sequence whose cache already holds `cached` tokens and which now adds `tokens`.
  // `all_logits` asks for every new row's logits, otherwise only the last row's.
  // `want_logits` false asks for none (a prefill chunk that does not reach the end).
  void add_sequence(const std::vector<int32_t>& new_tokens, int64_t cached, const SequenceKv& kv,
                    int block_size, bool all_logits, bool want_logits = true);
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int num_seqs() const { return static_cast<int>(context_lens.size()); }
  // What the kernels need for the layers of cache group `group`.
  AttentionBatch attention_view(int group = 0) const;
  // Whether some sequence replays a prefix (see PrefixReplay).
  bool replays() const;
};

// Receives hidden states: index 0 the embeddings, i the output of layer i, and the last
// index the final-norm output (transformers' output_hidden_states convention).
using HiddenStateSink = std::function<void(int index, const Tensor& hidden)>;

// How DeepSeek's multi-head latent attention keeps its cache.
//   kLatent: per token and layer only the normalised latent and the rope key
//            (kv_lora_rank + qk_rope_head_dim values); decode runs in the absorbed form.
//   kExpanded: per-head keys and values, as a plain multi-head model would (the reference
//            the latent form is tested against; ~70x the bytes for DeepSeek-V3).
enum class MlaCache { kLatent, kExpanded };

struct ModelLoadOptions {
  LoadMode mode = LoadMode::kMmap;
  MlaCache mla_cache = MlaCache::kLatent;
  // With the latent cache, a sequence adding at least this many tokens in one forward expands
  // its cached latents into per-head keys and values (cheaper for long prompts); fewer tokens
  // use the absorbed form. 0 picks the point where both cost the same arithmetic.
  int mla_expand_min_tokens = 0;
  // GPU backends: decode steps of up to 8 sequences replay recorded ops (CUDA graphs), one per
  // shape; false runs every step op by op (vLLM's --enforce-eager).
  bool record_decode_steps = true;
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual const ModelConfig& config() const = 0;
  // The backend the model computes with; its weights live in that backend's memory.
  virtual Ops& ops() const = 0;
  // The KV layout this model needs (per layer K/V heads and head size).
  virtual KvCacheShape kv_shape(int block_size) const = 0;
  // The weights one decode step reads in full (for bandwidth rooflines).
  virtual std::vector<const Tensor*> weights_read_per_token() const = 0;
  size_t weight_bytes_per_token() const;
  // Of those, the routed experts' (MoE models: experts_per_token of them a MoE layer).
  virtual std::vector<const Tensor*> routed_weights_per_token() const { return {}; }
  // The weights a decode step of `batch` rows reads: the rest once, and of each MoE layer's
  // routed experts the number `batch` rows are expected to touch when routing is uniform,
  // E (1 - (1 - k / E)^batch) of E (a model whose router prefers some experts touches fewer).
  double weight_bytes_per_step(int batch) const;
  // Arithmetic of one token: 2 FLOPs per matmul weight it reads, plus attention over
  // `context` cached tokens (in the form prompt processing uses).
  double flops_per_token(double context) const;
  virtual double attention_flops_per_token(double context) const = 0;
  // Runs the batch: writes its K/V into `cache` and logits [logit_rows, vocab] (f32, in the
  // backend's memory: the engine samples them where they are) into `logits`.
  virtual void forward_into(const ForwardBatch& batch, KvCache& cache, Tensor& logits,
                            const HiddenStateSink& hidden_sink = nullptr) = 0;
  // The same with the logits copied into host memory.
  void forward(const ForwardBatch& batch, KvCache& cache, float* logits,
               const HiddenStateSink& hidden_sink = nullptr);
  // Decode steps replayed from recorded ops so far (ModelLoadOptions::record_decode_steps).
  virtual int64_t replayed_decode_steps() const { return 0; }
  // Bounded replay of a restored prefix (PrefixReplay): the widest attention window, the
  // fewest tokens a replay may recompute (state the next tokens read must be rebuilt), and
  // the number that makes its result the cold prefill's: every sliding layer's window, as
  // stacked windows reach back one window per layer. All 0 without sliding-window layers.
  struct ReplayBounds {
    int64_t window = 0;
    int64_t least = 0;
    int64_t exact = 0;
  };
  virtual ReplayBounds replay_bounds() const;
  // Multi-token-prediction modules (DeepSeek-V3's num_nextn_predict_layers), loaded for
  // speculative decoding: each module's tensors by their name inside the module
  // ("eh_proj.weight", "self_attn.kv_b_proj.weight", ...).
  virtual int num_mtp_modules() const { return 0; }
  virtual std::map<std::string, const Tensor*> mtp_module_weights(int /*index*/) const {
    return {};
  }
  // The cache of one MTP module (its one decoder layer).
  virtual KvCacheShape mtp_kv_shape(int block_size) const;
  // Runs MTP module `index` over `batch`, whose row at position i holds the token after it
  // (t[i+1]), with `previous` [T, hidden] the state the depth before left at that position:
  // the model's final-norm output for the first depth, the module's own `hidden` after that.
  // `cache` is the module's (mtp_kv_shape). Writes the module's output [T, hidden] into
  // `hidden` and the logits of batch.logit_rows into `logits` (backend memory, as forward_into).
  virtual void mtp_forward(int index, const ForwardBatch& batch, const Tensor& previous,
                           KvCache& cache, Tensor& hidden, Tensor& logits);
};

// Loads a Hugging Face model folder. Weights stay in their stored dtype.
std::unique_ptr<CausalLM> load_model(const std::filesystem::path& folder,
                                     const ModelLoadOptions& options, Ops& ops);
std::unique_ptr<CausalLM> load_model(const std::filesystem::path& folder, LoadMode mode, Ops& ops);

}  // namespace deepinfer

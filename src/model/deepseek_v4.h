// DeepSeek-V4 internals shared by its files (internal to the model module): weights, the
// layout of its state in the paged KV cache, hyper-connections, and the attention layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "kv/kv_cache.h"
#include "model/config.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/rope.h"
#include "model/safetensors.h"

namespace deepinfer::v4 {

// A compressor: gated pooling of `rate` tokens into one entry of `width` floats. Overlapping
// compressors (CSA and its indexer) project 2 * width per token: the first half pools into
// the next window's entry, the second into the token's own window's entry.
struct CompressorWeights {
  const Tensor* values = nullptr;    // wkv [projected, D]
  const Tensor* gates = nullptr;     // wgate [projected, D]
  std::vector<float> position_bias;  // ape [rate, projected]
  std::vector<float> norm;           // [width]
  int width = 0;
  bool overlapping = false;
  int projected() const { return overlapping ? 2 * width : width; }
};

struct AttentionWeights {
  const Tensor* q_down = nullptr;         // wq_a [q_lora_rank, D]
  const Tensor* q_norm = nullptr;         // [q_lora_rank]
  const Tensor* q_up = nullptr;           // wq_b [H * hd, q_lora_rank]
  const Tensor* kv = nullptr;             // wkv [hd, D]
  const Tensor* kv_norm = nullptr;        // [hd]
  std::vector<float> sinks;               // [H]
  std::vector<Tensor> out_groups;         // wo_a split into o_groups blocks of [R, H * hd / G]
  const Tensor* out_mix = nullptr;        // wo_b [D, G * R]
  CompressorWeights compressor;           // CSA and HCA layers
  CompressorWeights index_compressor;     // CSA layers
  const Tensor* index_q_up = nullptr;     // [nI * cI, q_lora_rank]
  const Tensor* index_weights = nullptr;  // [nI, D]
};

// One site's hyper-connection parameters (hc_attn_* or hc_ffn_*, or the final head's).
struct HyperConnection {
  std::vector<float> fn;     // [(2 + HC) * HC, HC * D] (the head: [HC, HC * D])
  std::vector<float> base;   // [(2 + HC) * HC] (the head: [HC])
  std::vector<float> scale;  // [3] (the head: [1])
};

struct LayerWeights {
  V4Attention kind = V4Attention::kSliding;
  int rate = 0;
  bool hash_routed = false;
  const Tensor* attention_norm = nullptr;
  const Tensor* ffn_norm = nullptr;
  HyperConnection attention_hc, ffn_hc;
  AttentionWeights attention;
  MoeWeights moe;  // the selection bias as correction bias, tid2eid as token_experts
};

// Where the model keeps a sequence's state in the paged cache. Every cache layer holds `row`
// floats per token (the head dim); a model layer's state spans several cache layers:
//  - its K=V rows (one cache layer, the sliding window);
//  - its compressors' inputs (projected values and gates per token, several cache layers whose
//    window reaches back to the start of every window still open: 2 * rate for CSA, rate for
//    HCA), from which entries are pooled when their window completes;
//  - its compressed entries, written in stripes of ceil(width / rate) floats over the slots of
//    the window's own tokens, so they cost width / rate floats per token. The stripes of every
//    compressed layer are packed into shared full-attention cache layers.
// A block holds whole windows (block size a multiple of every rate), so a block's stripes are
// complete when the block is, and a cached prefix carries its entries and compressor state.
struct CacheLayout {
  int row = 0;
  std::vector<int> cache_layer_window;  // per cache layer (0: full)
  std::vector<int> window_layer;        // per model layer
  std::vector<int> input_layer;         // per model layer: first cache layer of its inputs, -1
  std::vector<int64_t> input_width;     // floats of compressor inputs per token
  std::vector<int64_t> stripe_offset;   // per model layer: offset in the entry record
  std::vector<int64_t> stripe_width;    // floats per token (0 for sliding layers)
  int first_entry_layer = 0;
  int64_t entry_record_width = 0;

  static CacheLayout of(const ModelConfig& config);
  int num_cache_layers() const { return static_cast<int>(cache_layer_window.size()); }
  // Bytes per token that grow with the context (entries) and all of them with full windows.
  double entry_floats_per_token() const;
};

// Rows of floats a model layer keeps per token across consecutive cache layers of one group.
class TokenRecords {
 public:
  TokenRecords(const KvCache& cache, const ForwardBatch& batch, int first_cache_layer,
               int64_t offset = 0);
  // The element at `offset` of sequence `seq`'s record for `position`.
  float* at(int seq, int64_t position, int64_t offset) const;
  void write(int seq, int64_t position, int64_t offset, const float* values, int64_t count) const;
  void read(int seq, int64_t position, int64_t offset, float* values, int64_t count) const;

 private:
  std::vector<float*> layers_;          // every cache layer from the first on
  std::vector<const int32_t*> tables_;  // and its group's block tables
  int max_blocks_ = 0;
  int block_size_ = 0;
  int row_ = 0;
  int64_t offset_ = 0;
};

// Hyper-connections: `streams` [T, HC, D] residual streams.
struct HcMix {
  std::vector<float> pre, post;  // [T, HC]
  std::vector<float> comb;       // [T, HC, HC]
};
// Mixing weights for `streams` and the collapsed sub-layer input `collapsed` [T, D].
HcMix hc_pre(const ModelConfig& config, const HyperConnection& hc,
             const std::vector<float>& streams, int64_t tokens, float* collapsed);
// streams = post * out + comb^T streams, per token.
void hc_post(const ModelConfig& config, const HcMix& mix, const float* out, int64_t tokens,
             std::vector<float>& streams);
// The final collapse of the streams into hidden [T, D].
void hc_head(const ModelConfig& config, const HyperConnection& hc,
             const std::vector<float>& streams, int64_t tokens, float* hidden);

// The rope tables of one forward: main and compress, at the batch's positions.
struct RopeTables {
  RopeTables(const ModelConfig& config, const std::vector<int32_t>& positions);
  RotaryEmbedding compress;  // also for compressed entries, at their window's first position
  std::vector<float> main_cos, main_sin, compress_cos, compress_sin;
};

// The attention sub-layer: reads normed [T, D], writes the layer's state into the cache and
// out [T, D].
void run_attention(Ops& ops, const ModelConfig& config, const CacheLayout& layout,
                   const LayerWeights& layer, int layer_index, const ForwardBatch& batch,
                   const RopeTables& rope, KvCache& cache, const Tensor& normed, float* out);

}  // namespace deepinfer::v4

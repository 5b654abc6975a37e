// DeepSeek-V4 internals shared by its files (internal to the model module): weights, the
// layout of its state in the paged KV cache, and the attention layer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "kv/kv_cache.h"
#include "model/config.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/rope.h"
#include "model/safetensors.h"

namespace deepinfer::v4 {

// A compressor's projections and its small parameters widened to f32 in backend memory.
struct CompressorWeights {
  const Tensor* values = nullptr;  // wkv [projected, D]
  const Tensor* gates = nullptr;   // wgate [projected, D]
  BackendTensor position_bias;     // ape [rate, projected]
  BackendTensor norm;              // [width]
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
  BackendTensor sinks;                    // [H] f32
  std::vector<Tensor> out_groups;         // wo_a split into o_groups blocks of [R, H * hd / G]
  const Tensor* out_mix = nullptr;        // wo_b [D, G * R]
  CompressorWeights compressor;           // CSA and HCA layers
  CompressorWeights index_compressor;     // CSA layers
  const Tensor* index_q_up = nullptr;     // [nI * cI, q_lora_rank]
  const Tensor* index_weights = nullptr;  // [nI, D]
};

// One site's hyper-connection parameters in f32.
struct HyperConnectionWeights {
  BackendTensor fn, base, scale;
};

struct LayerWeights {
  V4Attention kind = V4Attention::kSliding;
  int rate = 0;
  bool hash_routed = false;
  const Tensor* attention_norm = nullptr;
  const Tensor* ffn_norm = nullptr;
  HyperConnectionWeights attention_hc, ffn_hc;
  AttentionWeights attention;
  MoeWeights moe;  // the selection bias as correction bias, tid2eid as token_experts
};

// Where the model keeps a sequence's state in the paged cache. Every cache layer holds `row`
// floats per token (the head dim); a model layer's state spans several cache layers:
//  - its K=V rows (one cache layer, the sliding window);
//  - its compressors' inputs (projected values and gates per token, cache layers whose
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
};

// What one forward computes on the host from its batch's positions: rope tables as (cos, sin)
// pairs [rows, rope_dims / 2] - the main rope, the main rope turned back (cos, -sin), the
// compress rope and its back turn - then per compression rate (rates in order) the windows the
// batch completes as pairs (sequence, window) with the compress rope at their first positions.
// A recorded decode step lists one pair per row, (-1, 0) where a row completes none, so that
// its shape does not depend on the positions.
struct StepTables {
  static constexpr int kMainRope = 0, kMainBack = 1, kCompressRope = 2, kCompressBack = 3;
  static constexpr int kFirstWindowRope = 4;
  std::vector<std::vector<float>> rope;
  std::vector<std::vector<int32_t>> windows;

  static StepTables of(const ModelConfig& config, const ForwardBatch& batch, bool pair_per_row);
  // The distinct compression rates of the model's layers, in order.
  static std::vector<int> rates(const ModelConfig& config);
};

// What one forward shares across layers: the batch's tables and StepTables in backend memory.
struct ForwardContext {
  // Copies the batch's tables and its StepTables to the backend.
  ForwardContext(Ops& ops, const ModelConfig& config, const ForwardBatch& batch);
  // Reads them from a recorded step's fixed inputs (StepTables with a pair per row).
  ForwardContext(const ModelConfig& config, const ForwardBatch& batch, const ForwardInputs& inputs);

  // The windows one compression rate completes in this batch.
  struct Windows {
    const int32_t* pairs = nullptr;
    int64_t count = 0;
    const float* cos = nullptr;
    const float* sin = nullptr;
  };
  const Windows& windows_of(int rate) const;

  const ForwardBatch& batch;
  const int32_t* token_ids = nullptr;
  std::vector<AttentionBatch> attention;  // per cache group
  const float* main_cos = nullptr;
  const float* main_sin = nullptr;
  const float* main_unsin = nullptr;
  const float* compress_cos = nullptr;
  const float* compress_sin = nullptr;
  const float* compress_unsin = nullptr;

 private:
  void bind(const std::vector<const float*>& cos, const std::vector<const float*>& sin,
            const std::vector<const int32_t*>& pairs, const std::vector<int64_t>& counts);

  std::vector<int> rates_;
  std::vector<Windows> windows_;
  StepTables host_;  // what the eager constructor copied (the CPU reads it in place)
  std::optional<BatchTables> tables_;
  std::vector<BackendMemory> copies_;
};

// The attention sub-layer: reads normed [T, D], writes the layer's state into the cache and
// out [T, D]. `ones` [hd] is the weight of the per-head unweighted norm.
void run_attention(Ops& ops, const ModelConfig& config, const CacheLayout& layout,
                   const LayerWeights& layer, int layer_index, ForwardContext& forward,
                   KvCache& cache, const Tensor& ones, const Tensor& normed, Tensor& out);

}  // namespace deepinfer::v4

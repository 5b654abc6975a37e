// Building blocks the model families share (internal to the model module).
#pragma once

#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "model/model.h"
#include "model/safetensors.h"

namespace deepinfer {

// The tensor `name` with the given shape, checked to be in a dtype the kernels read (F32,
// BF16, F16, or F8_E4M3 with block scales attached).
const Tensor* layer_weight(const TensorStore& store, const std::string& name,
                           std::initializer_list<int64_t> shape);

// The tensor `name` with the given shape (F32, BF16 or F16) widened to floats in host memory:
// the small per-channel parameters code reads on the host (biases, norms, sinks).
std::vector<float> host_floats(Ops& ops, const TensorStore& store, const std::string& name,
                               std::initializer_list<int64_t> shape);

// gate_proj / up_proj / down_proj under `prefix` ("model.layers.3.mlp.").
struct GatedMlp {
  const Tensor* gate = nullptr;
  const Tensor* up = nullptr;
  const Tensor* down = nullptr;
};
GatedMlp bind_gated_mlp(const TensorStore& store, const std::string& prefix, int64_t hidden,
                        int64_t intermediate);

// out [T, hidden] = down(silu(gate(x)) * up(x)); gate and up run as one parallel pass. A
// positive swiglu_limit clamps the gate product from above and the up product both sides.
void run_gated_mlp(Ops& ops, const GatedMlp& mlp, const Tensor& x, Tensor& out,
                   float swiglu_limit = 0.0f);

// Where one forward's inputs lie for the kernels: token ids, the attention view of every KV
// cache group, and cos/sin per rope configuration.
struct ForwardInputs {
  const int32_t* token_ids = nullptr;
  std::vector<AttentionBatch> attention;
  std::vector<const float*> cos, sin;
  std::vector<const int32_t*> indices;  // any further index arrays the model packs
};

// A batch's index arrays packed end to end, each at an 8-byte boundary, for one copy into
// backend memory, and the views of them wherever that copy lands.
class PackedBatch {
 public:
  explicit PackedBatch(const ForwardBatch& batch);
  // Packs more host data after the batch's (rope tables); returns its offset in bytes().
  template <typename T>
  size_t append(const std::vector<T>& values) {
    size_t offset = bytes_.size();
    size_t size = values.size() * sizeof(T);
    bytes_.resize(offset + (size + 7) / 8 * 8);
    if (size > 0) std::memcpy(bytes_.data() + offset, values.data(), size);
    return offset;
  }
  const std::vector<std::byte>& bytes() const { return bytes_; }
  // Views into a copy of bytes() that starts at `base`.
  const int32_t* tokens(const std::byte* base) const;
  AttentionBatch attention(const std::byte* base, int group) const;

 private:
  const ForwardBatch& batch_;
  std::vector<std::byte> bytes_;
  size_t tokens_ = 0, query_start_ = 0, context_lens_ = 0, first_positions_ = 0;
  std::vector<size_t> block_tables_, slot_mapping_;
};

// A forward's index arrays where the backend's kernels read them: the batch's own vectors on
// the CPU, one upload per forward for a GPU.
class BatchTables {
 public:
  BatchTables(Ops& ops, const ForwardBatch& batch);
  const int32_t* tokens() const;
  // What the kernels need for the layers of cache group `group`.
  AttentionBatch attention(int group) const;

 private:
  const ForwardBatch& batch_;
  std::optional<PackedBatch> packed_;  // empty: read the batch's vectors
  BackendMemory memory_;
};

// Host floats (rope tables) where the backend's kernels read them; `keep` owns any copy.
const float* backend_floats(Ops& ops, const std::vector<float>& host, BackendMemory& keep);
const int32_t* backend_ints(Ops& ops, const std::vector<int32_t>& host, BackendMemory& keep);

// Hands `hidden` to the sink, first copying it to the host when the backend keeps it elsewhere.
void report_hidden(Ops& ops, const HiddenStateSink& sink, int index, const Tensor& hidden);

// The end of a recorded decode step: final norm of every row of `hidden` and lm_head into
// `logits` (backend memory).
void decode_logits(Ops& ops, const Tensor& hidden, const Tensor& final_norm, const Tensor& lm_head,
                   float eps, Tensor& logits);

// The end of every forward: final norm and lm_head over the batch's logit rows. With a sink,
// every row's final-norm output is reported first (index num_layers).
void final_logits(Ops& ops, const ForwardBatch& batch, Tensor hidden, const Tensor& final_norm,
                  const Tensor& lm_head, float eps, int num_layers, Tensor& logits,
                  const HiddenStateSink& hidden_sink);

// The family constructors load_model dispatches to.
std::unique_ptr<CausalLM> make_dense_model(ModelConfig config, std::unique_ptr<TensorStore> store,
                                           const ModelLoadOptions& options, Ops& ops);
std::unique_ptr<CausalLM> make_deepseek_model(ModelConfig config,
                                              std::unique_ptr<TensorStore> store,
                                              const ModelLoadOptions& options, Ops& ops);

std::unique_ptr<CausalLM> make_deepseek_v4_model(ModelConfig config,
                                                 std::unique_ptr<TensorStore> store,
                                                 const ModelLoadOptions& options, Ops& ops);

}  // namespace deepinfer

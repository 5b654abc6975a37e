#include "model/decode_graphs.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer {
namespace {

// Contexts are bucketed by 128 tokens (a multiple of the CUDA decode attention's key-split
// unit, 32 keys for a few sequences and 128 for many) and a recording sizes its splits by its
// bucket's longest context, so a growing sequence records a new step every 128 tokens
// (recording costs milliseconds); 64 buckets and up share the widest (splits saturate
// before). A different unit would only cost speed: the kernels are correct for any split
// count.
constexpr int64_t kContextBucket = 128;
constexpr int64_t kMaxBuckets = 64;

}  // namespace

bool DecodeGraphs::eligible(const ForwardBatch& batch) const {
  int64_t rows = batch.num_tokens();
  if (rows == 0 || rows > kMaxRows || rows != batch.num_seqs()) return false;
  if (batch.replays()) return false;  // recordings keep no first positions
  if (static_cast<int64_t>(batch.logit_rows.size()) != rows) return false;
  for (int64_t i = 0; i < rows; ++i) {
    if (batch.logit_rows[static_cast<size_t>(i)] != i) return false;
  }
  return ops_.device() != Device::kCpu;
}

DecodeGraphs::Shape& DecodeGraphs::shape_for(const Key& key, size_t input_bytes) {
  Shape& shape = shapes_[key];
  if (!shape.inputs) shape.inputs = ops_.allocate(input_bytes);
  return shape;
}

BackendMemory& DecodeGraphs::logits_for(int64_t rows) {
  BackendMemory& memory = logits_[rows];
  if (!memory) memory = ops_.allocate(static_cast<size_t>(rows * vocab_) * sizeof(float));
  return memory;
}

int64_t DecodeGraphs::context_bound(int64_t max_context) const {
  if (bound_ == ContextBound::kCapped) {
    return std::min(kMaxBuckets, (max_context + kContextBucket - 1) / kContextBucket) *
           kContextBucket;
  }
  int64_t bound = kContextBucket;
  while (bound < max_context) bound *= 2;
  return bound;
}

bool DecodeGraphs::run(const ForwardBatch& batch, const KvCache& cache,
                       const std::vector<std::vector<float>>& rope_host,
                       const std::vector<std::vector<int32_t>>& index_host, Tensor& logits,
                       const Body& body) {
  DI_CHECK(eligible(batch), "decode graphs: the batch is not a few decode rows");
  std::vector<const void*> storage;
  for (int layer = 0; layer < cache.shape().num_layers; ++layer) {
    storage.push_back(cache.layer(layer).keys);
    storage.push_back(cache.layer(layer).values);
  }
  if (storage != cache_storage_ || cache.shape().block_size != cache_block_size_) {
    shapes_.clear();
    cache_storage_ = std::move(storage);
    cache_block_size_ = cache.shape().block_size;
  }
  int64_t rows = batch.num_tokens();
  int64_t max_context = *std::max_element(batch.context_lens.begin(), batch.context_lens.end());
  const int64_t bound = context_bound(max_context);
  Key key{rows, bound, batch.max_blocks_per_seq};
  auto known = shapes_.find(key);
  if (known != shapes_.end() && known->second.unrecordable) return false;

  PackedBatch packed(batch);
  std::vector<size_t> rope_offsets, index_offsets;
  for (const std::vector<float>& table : rope_host) rope_offsets.push_back(packed.append(table));
  for (const std::vector<int32_t>& table : index_host)
    index_offsets.push_back(packed.append(table));
  Shape& shape = shape_for(key, packed.bytes().size());
  ops_.to_backend(shape.inputs.get(), packed.bytes().data(), packed.bytes().size());

  const auto* base = static_cast<const std::byte*>(shape.inputs.get());
  ForwardInputs inputs;
  inputs.token_ids = packed.tokens(base);
  for (int g = 0; g < static_cast<int>(batch.block_tables.size()); ++g) {
    AttentionBatch view = packed.attention(base, g);
    view.max_context_len = bound;  // what the recording sized its work by
    inputs.attention.push_back(view);
  }
  for (size_t r = 0; r < rope_offsets.size(); r += 2) {
    inputs.cos.push_back(reinterpret_cast<const float*>(base + rope_offsets[r]));
    inputs.sin.push_back(reinterpret_cast<const float*>(base + rope_offsets[r + 1]));
  }
  for (size_t offset : index_offsets)
    inputs.indices.push_back(reinterpret_cast<const int32_t*>(base + offset));
  BackendMemory& logits_memory = logits_for(rows);
  Tensor logits_view =
      Tensor::contiguous(logits_memory.get(), DType::kF32, {rows, vocab_}, ops_.device());
  if (!shape.recorded) {
    try {
      shape.recorded = ops_.record([&] { body(inputs, logits_view); });
    } catch (const Error&) {
      // Nothing ran while recording, so the step is still to do: op by op from now on.
      shape.unrecordable = true;
      return false;
    }
    DI_CHECK(shape.recorded != nullptr, "decode graphs: the backend records nothing");
  }
  shape.recorded->replay();
  ++replays_;
  ops_.copy(logits_view, logits);
  return true;
}

}  // namespace deepinfer

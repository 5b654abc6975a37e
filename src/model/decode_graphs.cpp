#include "model/decode_graphs.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace deepinfer {
namespace {

// Contexts are bucketed by 32 tokens (the CUDA attention's key-split unit), so a shape's split
// count is the one every context in its bucket would get; 64 buckets and up share the widest
// (splits saturate before). A different unit would only cost speed: the kernels are correct
// for any split count.
constexpr int64_t kContextBucket = 32;
constexpr int64_t kMaxBuckets = 64;

// Packs arrays end to end, each at an 8-byte boundary.
class Packer {
 public:
  template <typename T>
  size_t add(const T* values, size_t count) {
    size_t offset = bytes_.size();
    size_t size = count * sizeof(T);
    bytes_.resize(offset + (size + 7) / 8 * 8);
    if (size > 0) std::memcpy(bytes_.data() + offset, values, size);
    return offset;
  }
  const std::vector<std::byte>& bytes() const { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

}  // namespace

bool DecodeGraphs::eligible(const ForwardBatch& batch) const {
  int64_t rows = batch.num_tokens();
  if (rows == 0 || rows > kMaxRows || rows != batch.num_seqs()) return false;
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

void DecodeGraphs::run(const ForwardBatch& batch, const KvCache& cache,
                       const std::vector<std::vector<float>>& rope_host, float* logits,
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
  int64_t bucket = std::min(kMaxBuckets, (max_context + kContextBucket - 1) / kContextBucket);
  Key key{rows, bucket, batch.max_blocks_per_seq};

  Packer packer;
  std::vector<size_t> offsets;
  offsets.push_back(packer.add(batch.tokens.data(), batch.tokens.size()));
  offsets.push_back(packer.add(batch.query_start.data(), batch.query_start.size()));
  offsets.push_back(packer.add(batch.context_lens.data(), batch.context_lens.size()));
  for (size_t g = 0; g < batch.block_tables.size(); ++g) {
    offsets.push_back(packer.add(batch.block_tables[g].data(), batch.block_tables[g].size()));
    offsets.push_back(packer.add(batch.slot_mapping[g].data(), batch.slot_mapping[g].size()));
  }
  for (const std::vector<float>& table : rope_host)
    offsets.push_back(packer.add(table.data(), table.size()));
  Shape& shape = shape_for(key, packer.bytes().size());
  ops_.to_backend(shape.inputs.get(), packer.bytes().data(), packer.bytes().size());

  auto* base = static_cast<std::byte*>(shape.inputs.get());
  ForwardInputs inputs;
  inputs.token_ids = reinterpret_cast<const int32_t*>(base + offsets[0]);
  size_t next = 3;
  for (size_t g = 0; g < batch.block_tables.size(); ++g) {
    AttentionBatch view = batch.attention_view(static_cast<int>(g));
    view.query_start = reinterpret_cast<const int32_t*>(base + offsets[1]);
    view.context_lens = reinterpret_cast<const int32_t*>(base + offsets[2]);
    view.block_tables = reinterpret_cast<const int32_t*>(base + offsets[next++]);
    view.slot_mapping = reinterpret_cast<const int64_t*>(base + offsets[next++]);
    view.max_context_len = bucket * kContextBucket;  // what the recording sized its splits by
    inputs.attention.push_back(view);
  }
  for (size_t r = 0; r < rope_host.size(); r += 2) {
    inputs.cos.push_back(reinterpret_cast<const float*>(base + offsets[next++]));
    inputs.sin.push_back(reinterpret_cast<const float*>(base + offsets[next++]));
  }
  BackendMemory& logits_memory = logits_for(rows);
  Tensor logits_view =
      Tensor::contiguous(logits_memory.get(), DType::kF32, {rows, vocab_}, ops_.device());
  if (!shape.recorded) {
    shape.recorded = ops_.record([&] { body(inputs, logits_view); });
    DI_CHECK(shape.recorded != nullptr, "decode graphs: the backend records nothing");
  }
  shape.recorded->replay();
  ops_.to_host(logits, logits_memory.get(), static_cast<size_t>(rows * vocab_) * sizeof(float));
}

}  // namespace deepinfer

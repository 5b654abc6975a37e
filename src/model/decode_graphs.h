// Decode steps of a few sequences replayed from recorded ops (CUDA graphs): the per-kernel
// launch costs of a step are paid once, when its shape is first seen. Internal to the model
// module.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "kernels/ops.h"
#include "model/layers.h"
#include "model/model.h"

namespace deepinfer {

class DecodeGraphs {
 public:
  // Steps of up to this many rows are recorded: the rows past the few-rows kernels' limit
  // run their products on cuBLASLt inside the recording (workspace from the graph's pool).
  static constexpr int kMaxRows = 8;

  // How a recording's context bound (AttentionBatch::max_context_len) is chosen. kCapped:
  // steps of 128 tokens up to 8,192, which also covers longer contexts (for kernels that only
  // size key splits by it). kCovering: the longest context rounded up to a power of two (at
  // least 128), for kernels that size their work by it.
  enum class ContextBound { kCapped, kCovering };

  DecodeGraphs(Ops& ops, int64_t vocab, ContextBound bound = ContextBound::kCapped)
      : ops_(ops), vocab_(vocab), bound_(bound) {}

  // Whether `batch` can replay: a backend that records, one new token per sequence, at most
  // kMaxRows sequences, every row's logits wanted in order.
  bool eligible(const ForwardBatch& batch) const;

  // Writes `body`'s logits [rows, vocab] for `batch` into `logits` (backend memory). `rope_host`
  // holds cos then sin per rope configuration ([rows, half] each) and `index_host` any further
  // index arrays (ForwardInputs::indices); their sizes must follow from the shape. The first
  // batch of a shape (rows, context bound, table width) records `body`; every batch of that
  // shape replays it over fixed input and output buffers that are refilled first. Returns false
  // (writing nothing) when the shape cannot be recorded, e.g. because `body` reads results
  // back to the host: the caller runs the step op by op, as it will every later step of it.
  using Body = std::function<void(const ForwardInputs& inputs, Tensor& logits)>;
  // Recordings hold `cache`'s addresses: a different cache drops them.
  bool run(const ForwardBatch& batch, const KvCache& cache,
           const std::vector<std::vector<float>>& rope_host,
           const std::vector<std::vector<int32_t>>& index_host, Tensor& logits, const Body& body);
  int64_t replays() const { return replays_; }

 private:
  // Fixed buffers and the recording of one shape.
  struct Shape {
    BackendMemory inputs;  // packed tables, then rope tables, then index arrays
    std::unique_ptr<RecordedOps> recorded;
    bool unrecordable = false;
  };
  using Key = std::tuple<int64_t, int64_t, int>;  // rows, context bound, table width

  Shape& shape_for(const Key& key, size_t input_bytes);
  BackendMemory& logits_for(int64_t rows);
  int64_t context_bound(int64_t max_context) const;

  Ops& ops_;
  int64_t vocab_;
  ContextBound bound_;
  std::map<Key, Shape> shapes_;
  std::map<int64_t, BackendMemory> logits_;
  std::vector<const void*> cache_storage_;  // the cache the recordings write into
  int cache_block_size_ = 0;
  int64_t replays_ = 0;
};

}  // namespace deepinfer

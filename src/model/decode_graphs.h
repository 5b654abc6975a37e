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
  static constexpr int kMaxRows = 8;  // the decode products' few-rows path

  DecodeGraphs(Ops& ops, int64_t vocab) : ops_(ops), vocab_(vocab) {}

  // Whether `batch` can replay: a backend that records, one new token per sequence, at most
  // kMaxRows sequences, every row's logits wanted in order.
  bool eligible(const ForwardBatch& batch) const;

  // Writes `body`'s logits [rows, vocab] for `batch` into `logits` (backend memory). `rope_host`
  // holds cos then sin per rope configuration ([rows, half] each). The first batch of a shape
  // (rows, key-split bucket, table width) records `body`; every batch of that shape replays it over
  // fixed input and output buffers that are refilled first.
  using Body = std::function<void(const ForwardInputs& inputs, Tensor& logits)>;
  // Recordings hold `cache`'s addresses: a different cache drops them.
  void run(const ForwardBatch& batch, const KvCache& cache,
           const std::vector<std::vector<float>>& rope_host, Tensor& logits, const Body& body);

 private:
  // Fixed buffers and the recording of one shape.
  struct Shape {
    BackendMemory inputs;  // packed tables, then rope tables
    std::vector<size_t> offsets;
    std::unique_ptr<RecordedOps> recorded;
  };
  using Key = std::tuple<int64_t, int64_t, int>;  // rows, context bucket, table width

  Shape& shape_for(const Key& key, size_t input_bytes);
  BackendMemory& logits_for(int64_t rows);

  Ops& ops_;
  int64_t vocab_;
  std::map<Key, Shape> shapes_;
  std::map<int64_t, BackendMemory> logits_;
  std::vector<const void*> cache_storage_;  // the cache the recordings write into
  int cache_block_size_ = 0;
};

}  // namespace deepinfer

// DeepSeek-V4's operations on the CPU (the reference for other backends): hyper-connections,
// the paged records of compressor inputs and entries, compression, the lightning indexer and
// attention over the window, the chosen entries and the sinks.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/ops.h"

namespace deepinfer::cpu {

void hc_pre(ThreadPool& pool, const Tensor& streams, const HyperConnection& hc, Tensor* mix,
            Tensor& collapsed);
void hc_post(ThreadPool& pool, const Tensor& out, const Tensor& mix, Tensor& streams);
void write_records(const Tensor& values, const AttentionBatch& batch, const PagedRecords& records);
void compress_windows(ThreadPool& pool, const PagedRecords& inputs, const Compressor& compressor,
                      const int32_t* windows, int64_t count, const float* cos, const float* sin,
                      const EntryStripes& entries);
void index_select(ThreadPool& pool, const Tensor& queries, const Tensor& head_weights, float scale,
                  const AttentionBatch& batch, const EntryStripes& entries, int64_t key_offset,
                  int k, int32_t* selected);
void sparse_attention(ThreadPool& pool, const Tensor& q, const AttentionBatch& batch,
                      const PagedKvView& window_cache, int window, const EntryStripes& entries,
                      const int32_t* selected, int k, const Tensor& sinks, float scale,
                      Tensor& out);

}  // namespace deepinfer::cpu

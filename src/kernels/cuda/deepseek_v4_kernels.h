// DeepSeek-V4's kernels on the GPU (the CPU's kernels/cpu/deepseek_v4.cpp on the device):
// hyper-connections, paged records, compression, the lightning indexer and sparse attention.
// Plain f32 arithmetic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/ops.h"

namespace deepinfer::cuda {

// PagedRecords with its pointer arrays in device memory.
struct DeviceRecords {
  float* const* layers = nullptr;
  const int32_t* const* tables = nullptr;
  int num_layers = 0;
  int max_blocks_per_seq = 0;
  int block_size = 0;
  int row = 0;
  int64_t offset = 0;
};

struct DeviceStripes {
  DeviceRecords records;
  int64_t stripe = 0;
  int rate = 0;
};

// Where each row of a batch lies: device arrays of AttentionBatch.
struct DeviceRows {
  const int32_t* query_start = nullptr;
  const int32_t* context_lens = nullptr;
  int num_seqs = 0;
  const int32_t* first_positions = nullptr;  // AttentionBatch::first_positions
};

// Writes `count` addresses into device memory `out` by launches whose parameters carry them,
// so that a recorded step writes them again when replayed (a copy from host memory would
// read a host buffer that is gone by then).
void store_addresses(const uintptr_t* addresses, int64_t count, uintptr_t* out,
                     cudaStream_t stream);

// Scratch floats hc_pre needs: the partial products and pre of every token.
int64_t hc_pre_scratch_floats(int64_t tokens, int64_t width, int streams_count, int mixes);
void hc_pre(const float* streams, int64_t tokens, int64_t width, const float* fn, const float* base,
            const float* scale, int streams_count, int mixes, int sinkhorn_iterations, float eps,
            float norm_eps, float* scratch, float* mix, float* collapsed, cudaStream_t stream);
void hc_post(const float* out, const float* mix, int64_t tokens, int64_t width, int streams_count,
             float* streams, cudaStream_t stream);
void write_records(const float* values, int64_t tokens, int64_t width, DeviceRows rows,
                   DeviceRecords records, cudaStream_t stream);
// windows: device pairs (sequence, window), `count` of them; negative sequences are skipped.
void compress_windows(DeviceRecords inputs, const Compressor& compressor,
                      const float* position_bias, const float* norm, const int32_t* windows,
                      int64_t count, const float* cos, const float* sin, DeviceStripes entries,
                      cudaStream_t stream);
// scores: scratch [tokens, max_visible] floats. tensor_cores allows bf16 products for the
// scores where index_scores_on_tensor_cores.
void index_select(const float* queries, const float* head_weights, int64_t tokens, int heads,
                  int dim, float scale, DeviceRows rows, DeviceStripes entries, int64_t key_offset,
                  int k, int64_t max_visible, bool tensor_cores, float* scores, int32_t* selected,
                  cudaStream_t stream);
// The scores alone, in f32 on CUDA cores, into scores [tokens, visible].
void index_scores(const float* queries, const float* head_weights, int64_t tokens, int heads,
                  int dim, float scale, DeviceRows rows, DeviceStripes entries, int64_t key_offset,
                  int64_t visible, float* scores, cudaStream_t stream);
// Whether the indexer's scores of `tokens` rows go to the tensor cores (bf16 products, f32
// sums): up to 64 heads of a multiple of 16 up to 256 dims, and rows enough to fill the GPU.
bool index_scores_on_tensor_cores(int64_t tokens, int heads, int dim);
// The tensor-core scores (indexer_mma.cu).
void index_scores_mma(const float* queries, const float* head_weights, int64_t tokens, int heads,
                      int dim, float scale, DeviceRows rows, DeviceStripes entries,
                      int64_t key_offset, int64_t max_visible, float* scores, cudaStream_t stream);
// Scratch floats sparse_attention needs for `max_keys` keys a query (0: none): a grid of few
// blocks (a decode of a few rows) splits the keys, and the splits' states meet there.
int64_t sparse_attention_workspace_floats(int64_t tokens, int heads, int dim, int64_t max_keys);
// Whether sparse_attention, allowed the tensor cores, runs `tokens` rows on them (bf16
// products, f32 softmax and sums): head sizes a multiple of 32 up to 512, and rows enough to
// fill the GPU (fewer where each row has many heads: a decode batch of 32 rows of 64 heads).
// Fewer rows, other head sizes and f32 precision take f32 kernels.
bool sparse_attention_on_tensor_cores(int64_t tokens, int heads, int dim);
// The tensor-core kernel itself (sparse_attention_mma.cu), without key splits.
void sparse_attention_mma(const float* q, int64_t tokens, int heads, int dim, DeviceRows rows,
                          const int32_t* window_tables, int max_blocks_per_seq,
                          const float* window_keys, int block_size, int window,
                          DeviceStripes entries, const int32_t* selected, int k, const float* sinks,
                          float scale, float* out, cudaStream_t stream);
void sparse_attention(const float* q, int64_t tokens, int heads, int dim, DeviceRows rows,
                      const int32_t* window_tables, int max_blocks_per_seq,
                      const float* window_keys, int block_size, int window, DeviceStripes entries,
                      const int32_t* selected, int k, int64_t max_keys, const float* sinks,
                      float scale, bool tensor_cores, float* out, float* workspace,
                      cudaStream_t stream);

}  // namespace deepinfer::cuda

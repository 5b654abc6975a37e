// Paged attention over the KV cache's blocks, for prefill chunks and decode alike.
#include <algorithm>
#include <cfloat>

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kv_elements.cuh"
#include "kernels/cuda/overlap.cuh"
#include "kernels/cuda/rope_turn.cuh"
#include "kernels/cuda/weight_chunks.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxValuePerLane = 16;  // value_dim <= 512 (MLA's latent)

// PagedKvView's stride helpers are host code; the same arithmetic for the device.
__device__ int64_t key_stride(const PagedKvView& cache) {
  return int64_t{cache.num_kv_heads} * cache.key_dim;
}
__device__ int64_t value_stride(const PagedKvView& cache) {
  return cache.values_in_keys ? key_stride(cache) : int64_t{cache.num_kv_heads} * cache.value_dim;
}

template <typename T>
__global__ void kv_write_kernel(const float* k, const float* v, const int64_t* slot_mapping,
                                PagedKvView cache) {
  const int64_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0) return;  // restored KV a replay keeps
  const int64_t key_width = key_stride(cache);
  T* keys = static_cast<T*>(cache.keys);
  for (int64_t i = threadIdx.x; i < key_width; i += blockDim.x)
    store_kv(keys, slot * key_width + i, k[token * key_width + i]);
  if (v == nullptr) return;
  const int64_t value_width = int64_t{cache.num_kv_heads} * cache.value_dim;
  T* values = static_cast<T*>(cache.values);
  for (int64_t i = threadIdx.x; i < value_width; i += blockDim.x)
    store_kv(values, slot * value_width + i, v[token * value_width + i]);
}

__device__ void rotate(float* v, int i, int half, float c, float s) {
  const Turned turned = rope_turn(v[i], v[i + half], c, s);
  v[i] = turned.first;
  v[i + half] = turned.second;
}

// Block per (token, head): blocks y < heads rotate q's head y in place; the others rotate
// key head y - heads in place and store it, with its unrotated tail and the head's values,
// into the token's cache slot. Every element has one owner.
template <typename T>
__global__ void rope_kv_write_kernel(float* q, int heads, float* k, const float* v,
                                     const float* cos, const float* sin, int rotary_dim,
                                     const int64_t* slot_mapping, PagedKvView cache) {
  release_dependents();
  await_producer();
  const int64_t token = blockIdx.x;
  const int dim = cache.key_dim, half = rotary_dim / 2;
  const float* c = cos + token * half;
  const float* s = sin + token * half;
  if (static_cast<int>(blockIdx.y) < heads) {
    float* head_query = q + (token * heads + blockIdx.y) * dim;
    for (int d = threadIdx.x; d < half; d += blockDim.x) rotate(head_query, d, half, c[d], s[d]);
    return;
  }
  const int head = static_cast<int>(blockIdx.y) - heads;
  const int64_t width = int64_t{cache.num_kv_heads} * dim;
  const int64_t offset = int64_t{head} * dim;
  const int64_t slot = slot_mapping[token];
  const bool stored = slot >= 0;  // < 0: restored KV a replay keeps (k is still rotated)
  float* key = k + token * width + offset;
  T* keys = static_cast<T*>(cache.keys) + slot * width + offset;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    if (d < half) {
      rotate(key, d, half, c[d], s[d]);
      if (!stored) continue;
      store_kv(keys, d, key[d]);
      store_kv(keys, d + half, key[d + half]);
    } else if (d >= rotary_dim && stored) {
      store_kv(keys, d, key[d]);
    }
  }
  if (!stored) return;
  T* values = static_cast<T*>(cache.values) + slot * width + offset;
  for (int d = threadIdx.x; d < dim; d += blockDim.x)
    store_kv(values, d, v[token * width + offset + d]);
}

// The first key a query at `position` reads: all of them without a window, else the window's
// (a replayed prefix's windows start at its first position).
__device__ int64_t first_key(const AttentionBatch& batch, int seq, int64_t position, int window) {
  if (window <= 0) return 0;
  const int64_t start = batch.first_positions ? batch.first_positions[seq] : 0;
  return max(start, position - window + 1);
}

__device__ int sequence_of(const int32_t* query_start, int num_seqs, int64_t row) {
  int low = 0, high = num_seqs - 1;
  while (low < high) {
    int middle = (low + high + 1) / 2;
    if (query_start[middle] <= row) {
      low = middle;
    } else {
      high = middle - 1;
    }
  }
  return low;
}

__device__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Block (row, head): warp w takes keys first + w, first + w + kWarps, ... keeping a running
// max, sum and weighted value sum; the warps' results are then rescaled to one max and added.
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    paged_attention_kernel(const float* q, int heads, AttentionBatch batch, PagedKvView cache,
                           float scale, int window, float* out) {
  const int64_t row = blockIdx.x;
  const int head = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int seq = sequence_of(batch.query_start, batch.num_seqs, row);
  const int64_t new_tokens = batch.query_start[seq + 1] - batch.query_start[seq];
  const int64_t position = batch.context_lens[seq] - new_tokens + (row - batch.query_start[seq]);
  const int64_t first = first_key(batch, seq, position, window);
  const int kv_head = head / (heads / cache.num_kv_heads);
  const int32_t* table = batch.block_tables + int64_t{seq} * batch.max_blocks_per_seq;
  const float* query = q + (row * heads + head) * cache.key_dim;
  const int64_t key_offset = int64_t{kv_head} * cache.key_dim;
  const int64_t value_offset =
      cache.values_in_keys ? key_offset : int64_t{kv_head} * cache.value_dim;

  float running_max = -FLT_MAX, running_sum = 0.0f;
  float acc[kMaxValuePerLane] = {};
  for (int64_t j = first + warp; j <= position; j += kWarps) {
    const int64_t slot =
        int64_t{table[j / cache.block_size]} * cache.block_size + j % cache.block_size;
    const T* key = static_cast<const T*>(cache.keys) + slot * key_stride(cache) + key_offset;
    float partial = 0.0f;
    for (int d = lane; d < cache.key_dim; d += 32) partial += query[d] * load_kv(key, d);
    const float score = warp_sum(partial) * scale;
    const float new_max = fmaxf(running_max, score);
    const float rescale = __expf(running_max - new_max), weight = __expf(score - new_max);
    running_sum = running_sum * rescale + weight;
    running_max = new_max;
    const T* value =
        static_cast<const T*>(cache.values) + slot * value_stride(cache) + value_offset;
#pragma unroll
    for (int i = 0; i < kMaxValuePerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < cache.value_dim) acc[i] = acc[i] * rescale + weight * load_kv(value, d);
    }
  }
  __shared__ float maxes[kWarps], sums[kWarps];
  __shared__ float values[kWarps][kMaxValuePerLane * 32];
  if (lane == 0) {
    maxes[warp] = running_max;
    sums[warp] = running_sum;
  }
#pragma unroll
  for (int i = 0; i < kMaxValuePerLane; ++i) values[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float total_max = -FLT_MAX;
  for (int w = 0; w < kWarps; ++w) total_max = fmaxf(total_max, maxes[w]);
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w)
    if (sums[w] > 0.0f) total += sums[w] * __expf(maxes[w] - total_max);
  float* result = out + (row * heads + head) * cache.value_dim;
  for (int d = threadIdx.x; d < cache.value_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (sums[w] > 0.0f) sum += values[w][d] * __expf(maxes[w] - total_max);
    result[d] = sum / total;
  }
}

constexpr int kGroupDim = 128;  // head size of the grouped kernel (Llama, Qwen, Mistral)
constexpr int kMaxGroup = 8;    // query heads per KV head it handles

// A split's partial result per head: the unnormalised values, then max and sum, padded so
// every record starts 16-byte aligned (the values are written as float4).
constexpr int kPartialFloats = kGroupDim + 4;

// Lanes that share one key's scores: 1 for many rows (a warp tile of 32 keys, the fewest
// instructions per key), 4 for decode of a few sequences, where each block's chain of
// dependent instructions, not bandwidth, sets the time: a tile of 8 keys has a quarter of
// the chain and the keys spread over four times the blocks.
constexpr int64_t kFewRows = 8;
int score_lanes(int64_t rows) {
  return rows <= kFewRows ? 4 : 1;
}
int64_t keys_per_split(int64_t rows) {
  return int64_t{kWarps} * 32 / score_lanes(rows);
}

__device__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// score[h] = key . queries[h] over this lane's kDims dims of the key, starting at `dim`, read
// in 16-byte chunks.
template <int kGroup, int kDims>
__device__ void key_scores(const __nv_bfloat16* key, const float4 (*queries)[kGroupDim / 4],
                           int dim, int group, float* score) {
  const uint4* chunks = reinterpret_cast<const uint4*>(key + dim);
#pragma unroll
  for (int h = 0; h < kGroup; ++h) score[h] = 0.0f;
#pragma unroll 8
  for (int c = 0; c < kDims / 8; ++c) {
    float w[8];
    Bf16Chunks{}.widen(chunks[c], w);
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      if (h >= group) break;
      const float4 a = queries[h][dim / 4 + 2 * c], b = queries[h][dim / 4 + 2 * c + 1];
      score[h] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y +
                  w[6] * b.z + w[7] * b.w;
    }
  }
}
template <int kGroup, int kDims>
__device__ void key_scores(const float* key, const float4 (*queries)[kGroupDim / 4], int dim,
                           int group, float* score) {
  const float4* chunks = reinterpret_cast<const float4*>(key + dim);
#pragma unroll
  for (int h = 0; h < kGroup; ++h) score[h] = 0.0f;
#pragma unroll 8
  for (int c = 0; c < kDims / 4; ++c) {
    const float4 w = chunks[c];
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      if (h >= group) break;
      const float4 a = queries[h][dim / 4 + c];
      score[h] += w.x * a.x + w.y * a.y + w.z * a.z + w.w * a.w;
    }
  }
}

// Dims [chunk * n, (chunk + 1) * n) of a value row as floats, one 16-byte load (n = 8 for
// bf16, 4 for f32).
__device__ void value_chunk(const __nv_bfloat16* row, int chunk, float* v) {
  Bf16Chunks{}.widen(reinterpret_cast<const uint4*>(row)[chunk], v);
}
__device__ void value_chunk(const float* row, int chunk, float* v) {
  const float4 f = reinterpret_cast<const float4*>(row)[chunk];
  v[0] = f.x;
  v[1] = f.y;
  v[2] = f.z;
  v[3] = f.w;
}

// The warps' results of a grouped block, in shared memory: each warp's running max and sum
// and unnormalised values per head.
template <int kGroup>
struct GroupPartials {
  float maxes[kWarps][kGroup], sums[kWarps][kGroup];
  float4 values[kWarps][kGroup][kGroupDim / 4];
};

// One warp's online softmax over its tiles of kTile keys for every query of the group.
// Scores: kScoreLanes lanes take one key of the tile against all the queries, each over its
// share of the dims (one warp reduction per tile for the max and the sum, not one per key).
// Values: each load covers kDims dims of kKeysPerLoad keys (a bf16 row of 128 is 16 lanes of
// 16 bytes, so a warp reads two keys' values per load).
template <typename T, int kGroup, int kScoreLanes>
struct WarpAttention {
  static constexpr int kTile = 32 / kScoreLanes;
  static constexpr int kScoreDims = kGroupDim / kScoreLanes;
  static constexpr int kDims = 16 / sizeof(T);
  static constexpr int kLanesPerKey = kGroupDim / kDims;
  static constexpr int kKeysPerLoad = 32 / kLanesPerKey;
  int group, key_of_lane, dims_of_lane;
  float running_max[kGroup], running_sum[kGroup];
  float acc[kGroup][kDims];

  __device__ explicit WarpAttention(int group_size)
      : group(group_size),
        key_of_lane(threadIdx.x % 32 / kLanesPerKey),
        dims_of_lane(threadIdx.x % 32 % kLanesPerKey) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      running_max[h] = -FLT_MAX;
      running_sum[h] = 0.0f;
#pragma unroll
      for (int d = 0; d < kDims; ++d) acc[h][d] = 0.0f;
    }
  }

  // Keys [tile, tile + count) (count <= kTile); `slot` is the cache slot of this lane's key
  // (lane / kScoreLanes of the tile).
  __device__ void attend(const T* keys, const T* values, int64_t stride, int64_t slot, int count,
                         const float4 (*queries)[kGroupDim / 4]) {
    const int lane = threadIdx.x % 32, part = lane % kScoreLanes;
    const bool valid = lane / kScoreLanes < count;
    float score[kGroup];
    key_scores<kGroup, kScoreDims>(keys + slot * stride, queries, part * kScoreDims, group, score);
    float weight[kGroup];
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      if (h >= group) break;
#pragma unroll
      for (int offset = 1; offset < kScoreLanes; offset *= 2)
        score[h] += __shfl_xor_sync(0xffffffffu, score[h], offset);
      const float s = valid ? score[h] : -FLT_MAX;
      const float new_max = fmaxf(running_max[h], warp_max(s));
      const float rescale = __expf(running_max[h] - new_max);
      weight[h] = valid ? __expf(s - new_max) : 0.0f;
      running_sum[h] = running_sum[h] * rescale + warp_sum(part == 0 ? weight[h] : 0.0f);
      running_max[h] = new_max;
#pragma unroll
      for (int d = 0; d < kDims; ++d) acc[h][d] *= rescale;
    }
#pragma unroll 8
    for (int i = 0; i < count; i += kKeysPerLoad) {
      const int key = i + key_of_lane;  // < 32
      const int owner = min(key, kTile - 1) * kScoreLanes;
      const int64_t key_slot = __shfl_sync(0xffffffffu, slot, owner);
      float v[kDims];
      if (key < count) {
        value_chunk(values + key_slot * stride, dims_of_lane, v);
      } else {
#pragma unroll
        for (int d = 0; d < kDims; ++d) v[d] = 0.0f;
      }
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        if (h >= group) break;
        const float p = __shfl_sync(0xffffffffu, weight[h], owner);
#pragma unroll
        for (int d = 0; d < kDims; ++d) acc[h][d] += p * v[d];
      }
    }
  }

  // The lanes that held other keys' values of the same dims add theirs in; one lane per
  // dims chunk writes the warp's record.
  __device__ void store(GroupPartials<kGroup>& partials, int warp) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      if (threadIdx.x % 32 == 0) {
        partials.maxes[warp][h] = running_max[h];
        partials.sums[warp][h] = running_sum[h];
      }
#pragma unroll
      for (int d = 0; d < kDims; ++d)
        for (int offset = kLanesPerKey; offset < 32; offset *= 2)
          acc[h][d] += __shfl_xor_sync(0xffffffffu, acc[h][d], offset);
      if (key_of_lane == 0) {
#pragma unroll
        for (int q = 0; q < kDims / 4; ++q)
          partials.values[warp][h][dims_of_lane * (kDims / 4) + q] =
              make_float4(acc[h][4 * q], acc[h][4 * q + 1], acc[h][4 * q + 2], acc[h][4 * q + 3]);
      }
    }
  }
};

// One partial result of a head as a lane sees it: four dims of its unnormalised values, and
// the max and sum they were accumulated under.
struct RecordParts {
  float4 values;
  float max, sum;
};

struct MergedHead {
  float4 sum = make_float4(0, 0, 0, 0);
  float max = -FLT_MAX, total = 0.0f;
};
// Partial results rescaled to their common max and added; `part(i)` is record i of `count`
// (records with a zero sum saw no keys and are skipped).
template <typename Record>
__device__ MergedHead merge_records(int count, Record part) {
  MergedHead merged;
  for (int i = 0; i < count; ++i) {
    const RecordParts record = part(i);
    if (record.sum > 0.0f) merged.max = fmaxf(merged.max, record.max);
  }
  for (int i = 0; i < count; ++i) {
    const RecordParts record = part(i);
    if (record.sum == 0.0f) continue;
    const float factor = __expf(record.max - merged.max);
    merged.total += record.sum * factor;
    const float4 p = record.values;
    merged.sum.x += p.x * factor;
    merged.sum.y += p.y * factor;
    merged.sum.z += p.z * factor;
    merged.sum.w += p.w * factor;
  }
  return merged;
}
// Without `record`, the normalised result to `out_head`; otherwise the combined record there.
__device__ void write_merged(const MergedHead& merged, float* out_head, float* record) {
  const int lane = threadIdx.x % 32;
  if (record == nullptr) {
    const float total = merged.total;
    reinterpret_cast<float4*>(out_head)[lane] = make_float4(
        merged.sum.x / total, merged.sum.y / total, merged.sum.z / total, merged.sum.w / total);
    return;
  }
  if (lane == 0) {
    record[kGroupDim] = merged.max;
    record[kGroupDim + 1] = merged.total;
  }
  reinterpret_cast<float4*>(record)[lane] = merged.sum;
}

// The block's warps merged per head (warp w takes heads w, w + kWarps, ...): the final output
// with one split, else the split's partial record.
template <int kGroup>
__device__ void write_group(const GroupPartials<kGroup>& partials, int group, float* out,
                            float* partial_records) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int h = warp; h < group; h += kWarps) {
    const MergedHead merged = merge_records(kWarps, [&](int w) {
      return RecordParts{partials.values[w][h][lane], partials.maxes[w][h], partials.sums[w][h]};
    });
    write_merged(merged, out + h * kGroupDim,
                 partial_records ? partial_records + h * kPartialFloats : nullptr);
  }
}

// The splits' records of one (row, KV head) merged into the group's outputs, a warp per
// head. The records come from other blocks: read through L2 (__ldcg), never a stale L1 line.
__device__ void merge_splits(const float* records, int splits, int group, float* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int h = warp; h < group; h += kWarps) {
    const MergedHead merged = merge_records(splits, [&](int split) {
      const float* record = records + (int64_t{split} * kMaxGroup + h) * kPartialFloats;
      return RecordParts{__ldcg(reinterpret_cast<const float4*>(record) + lane),
                         __ldcg(record + kGroupDim), __ldcg(record + kGroupDim + 1)};
    });
    write_merged(merged, out + h * kGroupDim, nullptr);
  }
}

// Whether this block is the last of its (row, KV head) to leave its record: it then merges
// them all, and resets the arrival count for the next launch.
__device__ bool last_to_arrive(unsigned* arrivals, int splits) {
  __shared__ bool last;
  __threadfence();  // this block's records visible before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(arrivals, 1u) == static_cast<unsigned>(splits - 1);
    if (last) *arrivals = 0;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// Block (row, KV head, split) for the common GQA shape: every K/V row is read once for all
// the group's query heads. With several splits each block takes one contiguous share of the
// keys and leaves its partial result in `partials`; the last block of a (row, KV head) to
// finish merges them when given `arrivals` (one zeroed counter per (row, KV head)), else
// merge_splits_kernel does after.
template <typename T, int kGroup, int kScoreLanes>
__global__ void __launch_bounds__(kWarps * 32)
    grouped_attention_kernel(const float* q, int heads, AttentionBatch batch, PagedKvView cache,
                             float scale, int window, float* out, float* partials,
                             unsigned* arrivals) {
  using Attention = WarpAttention<T, kGroup, kScoreLanes>;
  release_dependents();
  const int64_t row = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int split = blockIdx.z, splits = gridDim.z;
  const int group = heads / cache.num_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int seq = sequence_of(batch.query_start, batch.num_seqs, row);
  const int64_t new_tokens = batch.query_start[seq + 1] - batch.query_start[seq];
  const int64_t position = batch.context_lens[seq] - new_tokens + (row - batch.query_start[seq]);
  const int64_t window_first = first_key(batch, seq, position, window);
  const int64_t share = (position - window_first + splits) / splits;
  const int64_t first = window_first + split * share;
  const int64_t last = min(position, first + share - 1);
  const int32_t* table = batch.block_tables + int64_t{seq} * batch.max_blocks_per_seq;
  auto slot_of = [&](int64_t tile) {
    const int64_t j = min(tile + lane / kScoreLanes, last);
    return int64_t{table[j / cache.block_size]} * cache.block_size + j % cache.block_size;
  };
  // The batch's tables reach the GPU by copies ordered before the step's first kernel, never
  // as a kernel's output, so the first tile's slot is looked up before the wait for q.
  const int64_t first_tile = first + int64_t{warp} * Attention::kTile;
  int64_t next_slot = first_tile <= last ? slot_of(first_tile) : 0;
  await_producer();
  const int64_t first_head = row * heads + int64_t{kv_head} * group;
  const auto* query = reinterpret_cast<const float4*>(q + first_head * kGroupDim);
  // The group's queries, pre-scaled, in shared memory: each lane reads all of them against
  // its own key (broadcast reads).
  __shared__ float4 queries[kGroup][kGroupDim / 4];
  for (int i = threadIdx.x; i < kGroup * kGroupDim / 4; i += blockDim.x) {
    const int h = i / (kGroupDim / 4);
    const float4 value = h < group ? query[i] : make_float4(0, 0, 0, 0);
    queries[h][i % (kGroupDim / 4)] =
        make_float4(value.x * scale, value.y * scale, value.z * scale, value.w * scale);
  }
  __syncthreads();
  const T* keys = static_cast<const T*>(cache.keys) + int64_t{kv_head} * kGroupDim;
  const T* values = static_cast<const T*>(cache.values) + int64_t{kv_head} * kGroupDim;
  Attention attention(group);
  for (int64_t tile = first_tile; tile <= last; tile += kWarps * Attention::kTile) {
    const int64_t slot = next_slot;
    if (tile + kWarps * Attention::kTile <= last)
      next_slot = slot_of(tile + kWarps * Attention::kTile);
    attention.attend(keys, values, key_stride(cache), slot,
                     static_cast<int>(min(int64_t{Attention::kTile}, last - tile + 1)), queries);
  }
  __shared__ GroupPartials<kGroup> warp_results;
  attention.store(warp_results, warp);
  __syncthreads();
  float* group_out = out + first_head * kGroupDim;
  if (splits == 1) {
    write_group(warp_results, group, group_out, nullptr);
    return;
  }
  float* records = partials + (row * cache.num_kv_heads + kv_head) * splits * kMaxGroup *
                                  int64_t{kPartialFloats};
  write_group(warp_results, group, group_out, records + split * kMaxGroup * kPartialFloats);
  if (arrivals && last_to_arrive(arrivals + row * cache.num_kv_heads + kv_head, splits))
    merge_splits(records, splits, group, group_out);
}

// Block (row, KV head): the splits' partial records merged, for launches without arrival
// counters.
__global__ void __launch_bounds__(kWarps * 32)
    merge_splits_kernel(const float* partials, int heads, int num_kv_heads, int splits,
                        float* out) {
  release_dependents();
  await_producer();
  const int64_t row = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int group = heads / num_kv_heads;
  merge_splits(
      partials + (row * num_kv_heads + kv_head) * splits * kMaxGroup * int64_t{kPartialFloats},
      splits, group, out + (row * heads + int64_t{kv_head} * group) * kGroupDim);
}

}  // namespace

void kv_write(const float* k, const float* v, const int64_t* slot_mapping, int64_t tokens,
              const PagedKvView& cache, cudaStream_t stream) {
  if (cache.values_in_keys != (v == nullptr))
    fail("kv_write: values must be given exactly when the cache stores them apart");
  if (tokens == 0) return;
  if (cache.dtype == DType::kBF16) {
    kv_write_kernel<__nv_bfloat16>
        <<<static_cast<unsigned>(tokens), 256, 0, stream>>>(k, v, slot_mapping, cache);
  } else {
    kv_write_kernel<float>
        <<<static_cast<unsigned>(tokens), 256, 0, stream>>>(k, v, slot_mapping, cache);
  }
  check_launch("kv_write");
}

void rope_kv_write(float* q, int heads, float* k, const float* v, const float* cos,
                   const float* sin, int rotary_dim, const int64_t* slot_mapping, int64_t tokens,
                   const PagedKvView& cache, cudaStream_t stream) {
  if (cache.values_in_keys || cache.value_dim != cache.key_dim || rotary_dim % 2 != 0 ||
      rotary_dim > cache.key_dim)
    fail("rope_kv_write: a cache of separate keys and values of one size, rotary_dim {} <= {}",
         rotary_dim, cache.key_dim);
  if (tokens == 0) return;
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(heads + cache.num_kv_heads));
  if (cache.dtype == DType::kBF16) {
    launch_overlapped(rope_kv_write_kernel<__nv_bfloat16>, grid, 64, 0, stream, q, heads, k, v, cos,
                      sin, rotary_dim, slot_mapping, cache);
  } else {
    launch_overlapped(rope_kv_write_kernel<float>, grid, 64, 0, stream, q, heads, k, v, cos, sin,
                      rotary_dim, slot_mapping, cache);
  }
  check_launch("rope_kv_write");
}

// Enough blocks for eight per multiprocessor of an H200 (32 warps: a warp streams one key at
// a time, so the SM needs many of them to keep loads in flight), at least one tile per warp.
// Two per SM left 64 x 2000-token batches at 0.9 TB/s with bf16 K/V.
constexpr int64_t kTargetSplitBlocks = 132 * 8;

int paged_attention_splits(int64_t rows, int num_kv_heads, int64_t max_context) {
  const int64_t blocks = std::max<int64_t>(1, rows * num_kv_heads);
  const int64_t keys = keys_per_split(rows);
  const int64_t wanted = std::min<int64_t>((kTargetSplitBlocks + blocks - 1) / blocks,
                                           (max_context + keys - 1) / keys);
  return static_cast<int>(std::clamp<int64_t>(wanted, 1, 64));
}

size_t paged_attention_workspace_floats(int64_t rows, int num_kv_heads, int splits) {
  return static_cast<size_t>(rows * num_kv_heads * splits) * kMaxGroup * kPartialFloats;
}

size_t paged_attention_workspace_limit_floats() {
  // Splits beyond one only while (row, KV head) blocks number fewer than the target, and then
  // at most ceil(target / blocks): blocks x splits < 2 x target.
  return paged_attention_workspace_floats(2 * kTargetSplitBlocks, 1, 1);
}

namespace {

// Whether grouped attention's blocks may be placed while the q/k/v + rope kernel before it
// still runs. Not for decode of a few rows: placed early they land on the few multiprocessors
// q/k/v frees first and share them, beside the o product's weight copies, and finish later
// (measured on an H200 at batch 1: 208-212 tok/s placed early against 214 placed once q/k/v
// has ended; the o product overlaps attention either way).
bool overlap_attention(int64_t rows) {
  return rows > kFewRows;
}

// grouped_attention_kernel's arguments after the launch shape.
struct GroupedArgs {
  const float* q;
  int heads;
  AttentionBatch batch;
  PagedKvView cache;
  float scale;
  int window;
  float* out;
  float* partials;
  unsigned* arrivals;
};

// The grouped kernel for the group size (registers sized to it, up to the next power of
// two: a group of 4, Llama 3 8B's, in a kernel sized for 8 held half the warps an SM could
// run) and the lanes per key.
template <typename T, int kScoreLanes>
void launch_grouped(int group, dim3 grid, cudaStream_t stream, const GroupedArgs& a) {
  auto launch = [&](auto kernel) {
    launch_maybe_overlapped(overlap_attention(grid.x), kernel, grid, kWarps * 32, 0, stream, a.q,
                            a.heads, a.batch, a.cache, a.scale, a.window, a.out, a.partials,
                            a.arrivals);
  };
  if (group <= 1) {
    launch(grouped_attention_kernel<T, 1, kScoreLanes>);
  } else if (group <= 2) {
    launch(grouped_attention_kernel<T, 2, kScoreLanes>);
  } else if (group <= 4) {
    launch(grouped_attention_kernel<T, 4, kScoreLanes>);
  } else {
    launch(grouped_attention_kernel<T, kMaxGroup, kScoreLanes>);
  }
}

void grouped_attention(const float* q, int64_t rows, int heads, const AttentionBatch& batch,
                       const PagedKvView& cache, float scale, int window, float* out,
                       cudaStream_t stream, SplitKeys split, float* workspace,
                       size_t workspace_floats) {
  const int group = heads / cache.num_kv_heads;
  const int splits = workspace ? split.splits : 1;
  if (workspace &&
      workspace_floats < paged_attention_workspace_floats(rows, cache.num_kv_heads, splits))
    fail("paged_attention: the workspace holds too few floats for {} splits", splits);
  // Arrival counters let the last split merge; without enough of them a merge kernel does.
  unsigned* arrivals =
      splits > 1 && split.arrival_slots >= rows * cache.num_kv_heads ? split.arrivals : nullptr;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(cache.num_kv_heads),
                  static_cast<unsigned>(splits));
  const GroupedArgs args{q, heads, batch, cache, scale, window, out, workspace, arrivals};
  const bool lane_per_key = score_lanes(rows) == 1;
  if (cache.dtype == DType::kBF16) {
    lane_per_key ? launch_grouped<__nv_bfloat16, 1>(group, grid, stream, args)
                 : launch_grouped<__nv_bfloat16, 4>(group, grid, stream, args);
  } else {
    lane_per_key ? launch_grouped<float, 1>(group, grid, stream, args)
                 : launch_grouped<float, 4>(group, grid, stream, args);
  }
  check_launch("paged_attention (grouped)");
  if (splits > 1 && arrivals == nullptr) {
    const dim3 merge_grid(static_cast<unsigned>(rows), static_cast<unsigned>(cache.num_kv_heads));
    launch_overlapped(merge_splits_kernel, merge_grid, kWarps * 32, 0, stream, workspace, heads,
                      cache.num_kv_heads, splits, out);
    check_launch("paged_attention (merge)");
  }
}

}  // namespace

void paged_attention(const float* q, int64_t rows, int heads, const AttentionBatch& batch,
                     const PagedKvView& cache, float scale, int window, float* out,
                     cudaStream_t stream, SplitKeys split, float* workspace,
                     size_t workspace_floats) {
  if (cache.value_dim > 32 * kMaxValuePerLane)
    fail("paged_attention: value size {} over {}", cache.value_dim, 32 * kMaxValuePerLane);
  if (heads % cache.num_kv_heads != 0)
    fail("paged_attention: {} heads over {} KV heads", heads, cache.num_kv_heads);
  if (rows == 0) return;
  if (cache.key_dim == kGroupDim && cache.value_dim == kGroupDim && !cache.values_in_keys &&
      heads / cache.num_kv_heads <= kMaxGroup) {
    grouped_attention(q, rows, heads, batch, cache, scale, window, out, stream, split, workspace,
                      workspace_floats);
    return;
  }
  dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(heads));
  if (cache.dtype == DType::kBF16) {
    paged_attention_kernel<__nv_bfloat16>
        <<<grid, kWarps * 32, 0, stream>>>(q, heads, batch, cache, scale, window, out);
  } else {
    paged_attention_kernel<float>
        <<<grid, kWarps * 32, 0, stream>>>(q, heads, batch, cache, scale, window, out);
  }
  check_launch("paged_attention");
}

}  // namespace deepinfer::cuda

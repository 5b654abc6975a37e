// Prompt attention on the tensor cores, flash-attention style: a block takes one tile of 64
// (query position, head) rows of a sequence, all heads of one KV head's group, and walks the
// sequence's paged keys 64 at a time: S = Q K^T and O += P V on bf16 WMMA fragments with f32
// accumulation, an online softmax in between, so the scores never reach device memory and
// every K/V tile is read once for the whole group.
#include <cuda_bf16.h>
#include <mma.h>

#include <cfloat>

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kv_elements.cuh"

namespace deepinfer::cuda {
namespace {

using namespace nvcuda;

constexpr int kDim = 128;  // head size (keys and values)
constexpr int kRows = 64;  // (position, head) rows per tile
constexpr int kKeys = 64;  // keys per step
constexpr int kWarps = 4;  // each owns 16 rows
constexpr int kThreads = kWarps * 32;
// Padded leading dimensions (elements) keep WMMA's row accesses off a single bank.
constexpr int kLdTile = kDim + 8;    // bf16 Q, K, V
constexpr int kLdScore = kKeys + 4;  // f32 S
constexpr int kLdProb = kKeys + 8;   // bf16 P
constexpr int kLdOut = kDim + 4;     // f32 O

struct Shared {
  __nv_bfloat16 q[kRows * kLdTile];
  __nv_bfloat16 k[kKeys * kLdTile];
  __nv_bfloat16 v[kKeys * kLdTile];
  float s[kRows * kLdScore];
  __nv_bfloat16 p[kRows * kLdProb];
  float o[kRows * kLdOut];
  float row_max[kRows], row_sum[kRows];
};

// Which sequence and which of its query positions tile `tile` covers; false past the end.
__device__ bool locate_tile(const AttentionBatch& batch, int positions_per_tile, int64_t tile,
                            int* seq, int64_t* first) {
  for (int s = 0; s < batch.num_seqs; ++s) {
    const int64_t count = batch.query_start[s + 1] - batch.query_start[s];
    const int64_t tiles = (count + positions_per_tile - 1) / positions_per_tile;
    if (tile < tiles) {
      *seq = s;
      *first = tile * positions_per_tile;
      return true;
    }
    tile -= tiles;
  }
  return false;
}

// One K/V tile in flight: thread t fetches 8 consecutive elements (16 bytes of bf16) of keys
// t / 16, t / 16 + 8, ... at column (t % 16) * 8, every load issued before the first is
// used, and keeps them in registers until the tile before has been consumed.
constexpr int kChunk = 8;
constexpr int kChunksPerKey = kDim / kChunk;            // 16
constexpr int kKeysPerPass = kThreads / kChunksPerKey;  // 8
constexpr int kFetches = kKeys / kKeysPerPass;          // 8

__device__ inline uint4 bf16_chunk(const __nv_bfloat16* at) {
  return *reinterpret_cast<const uint4*>(at);
}
__device__ inline uint4 bf16_chunk(const float* at) {
  const float4 low = reinterpret_cast<const float4*>(at)[0];
  const float4 high = reinterpret_cast<const float4*>(at)[1];
  uint4 packed;
  __nv_bfloat162 pairs[4] = {
      __floats2bfloat162_rn(low.x, low.y), __floats2bfloat162_rn(low.z, low.w),
      __floats2bfloat162_rn(high.x, high.y), __floats2bfloat162_rn(high.z, high.w)};
  memcpy(&packed, pairs, sizeof(packed));
  return packed;
}

template <typename T>
struct TileFetch {
  uint4 k[kFetches], v[kFetches];

  // Keys [first_key, first_key + kKeys); keys past the context become zeros (masked later).
  __device__ void fetch(const PagedKvView& cache, const int32_t* table, int64_t first_key,
                        int64_t context, int kv_head) {
    const int64_t key_stride = int64_t{cache.num_kv_heads} * kDim;
    const int column = (threadIdx.x % kChunksPerKey) * kChunk;
    int64_t at[kFetches];
#pragma unroll
    for (int f = 0; f < kFetches; ++f) {
      const int64_t key = first_key + threadIdx.x / kChunksPerKey + f * kKeysPerPass;
      at[f] = -1;
      if (key < context) {
        const int64_t slot =
            int64_t{table[key / cache.block_size]} * cache.block_size + key % cache.block_size;
        at[f] = slot * key_stride + int64_t{kv_head} * kDim + column;
      }
    }
    const T* keys = static_cast<const T*>(cache.keys);
    const T* values = static_cast<const T*>(cache.values);
#pragma unroll
    for (int f = 0; f < kFetches; ++f) {
      k[f] = at[f] >= 0 ? bf16_chunk(keys + at[f]) : make_uint4(0, 0, 0, 0);
      v[f] = at[f] >= 0 ? bf16_chunk(values + at[f]) : make_uint4(0, 0, 0, 0);
    }
  }

  __device__ void store(Shared& sh) const {
    const int column = (threadIdx.x % kChunksPerKey) * kChunk;
#pragma unroll
    for (int f = 0; f < kFetches; ++f) {
      const int row = threadIdx.x / kChunksPerKey + f * kKeysPerPass;
      *reinterpret_cast<uint4*>(sh.k + row * kLdTile + column) = k[f];
      *reinterpret_cast<uint4*>(sh.v + row * kLdTile + column) = v[f];
    }
  }
};

// Warp `warp`'s 16 rows: S = Q K^T.
__device__ void scores(Shared& sh, int warp) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kKeys / 16];
#pragma unroll
  for (int j = 0; j < kKeys / 16; ++j) wmma::fill_fragment(acc[j], 0.0f);
#pragma unroll
  for (int d = 0; d < kDim; d += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::load_matrix_sync(a, sh.q + warp * 16 * kLdTile + d, kLdTile);
#pragma unroll
    for (int j = 0; j < kKeys / 16; ++j) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
      wmma::load_matrix_sync(b, sh.k + j * 16 * kLdTile + d, kLdTile);
      wmma::mma_sync(acc[j], a, b, acc[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < kKeys / 16; ++j)
    wmma::store_matrix_sync(sh.s + warp * 16 * kLdScore + j * 16, acc[j], kLdScore,
                            wmma::mem_row_major);
}

// Warp `warp`'s 16 rows: O += P V (O in shared memory, already rescaled).
__device__ void accumulate_values(Shared& sh, int warp) {
#pragma unroll
  for (int j = 0; j < kDim / 16; ++j) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    float* o = sh.o + warp * 16 * kLdOut + j * 16;
    wmma::load_matrix_sync(acc, o, kLdOut, wmma::mem_row_major);
#pragma unroll
    for (int k = 0; k < kKeys; k += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
      wmma::load_matrix_sync(a, sh.p + warp * 16 * kLdProb + k, kLdProb);
      wmma::load_matrix_sync(b, sh.v + k * kLdTile + j * 16, kLdTile);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(o, acc, kLdOut, wmma::mem_row_major);
  }
}

// Q rows of the tile (positions 0..last_index from `q`, all heads of the group), pre-scaled;
// rows past the sequence's queries are zeros and never written out. O and the row statistics
// start empty.
__device__ void start_tile(Shared& sh, const float* q, int heads, int kv_head, int group,
                           int64_t last_index, float scale) {
  for (int i = threadIdx.x; i < kRows * (kDim / 4); i += kThreads) {
    const int r = i / (kDim / 4), c = (i % (kDim / 4)) * 4;
    float4 value = make_float4(0, 0, 0, 0);
    if (r / group <= last_index) {
      const int head = kv_head * group + r % group;
      value = *reinterpret_cast<const float4*>(q + (int64_t{r / group} * heads + head) * kDim + c);
    }
    __nv_bfloat162* d = reinterpret_cast<__nv_bfloat162*>(sh.q + r * kLdTile + c);
    d[0] = __floats2bfloat162_rn(value.x * scale, value.y * scale);
    d[1] = __floats2bfloat162_rn(value.z * scale, value.w * scale);
  }
  for (int i = threadIdx.x; i < kRows * kLdOut; i += kThreads) sh.o[i] = 0.0f;
  if (threadIdx.x < kRows) {
    sh.row_max[threadIdx.x] = -FLT_MAX;
    sh.row_sum[threadIdx.x] = 0.0f;
  }
}

// The lane pair of `row` (this lane's `half` of the 64 keys from key0): masks the scores the
// row may not see, writes P = exp(S - new max) and rescales the row's O and statistics.
__device__ void online_softmax(Shared& sh, int row, int half, int64_t key0, int64_t row_position,
                               bool row_valid, int window) {
  float* s = sh.s + row * kLdScore + half * 32;
  float tile_max = -FLT_MAX;
  for (int c = 0; c < 32; ++c) {
    const int64_t key = key0 + half * 32 + c;
    const bool visible =
        row_valid && key <= row_position && (window <= 0 || key > row_position - window);
    s[c] = visible ? s[c] : -FLT_MAX;
    tile_max = fmaxf(tile_max, s[c]);
  }
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
  const float old_max = sh.row_max[row];
  const float new_max = fmaxf(old_max, tile_max);
  const bool any = new_max > -FLT_MAX;
  float sum = 0.0f;
  __nv_bfloat16* p = sh.p + row * kLdProb + half * 32;
  for (int c = 0; c < 32; ++c) {
    const float weight = (any && s[c] > -FLT_MAX) ? __expf(s[c] - new_max) : 0.0f;
    p[c] = __float2bfloat16_rn(weight);
    sum += weight;
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  const float rescale = any ? __expf(old_max - new_max) : 1.0f;
  // Once the running maxima settle, most steps leave every row's scale at 1.
  if (__any_sync(0xffffffffu, rescale != 1.0f)) {
    float* o = sh.o + row * kLdOut + half * (kDim / 2);
    for (int c = 0; c < kDim / 2; ++c) o[c] *= rescale;
  }
  __syncwarp();
  if (half == 0) {
    sh.row_sum[row] = sh.row_sum[row] * rescale + sum;
    sh.row_max[row] = new_max;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    flash_attention_kernel(const float* q, int heads, AttentionBatch batch, PagedKvView cache,
                           float scale, int window, float* out) {
  extern __shared__ __align__(128) unsigned char shared_bytes[];
  Shared& sh = *reinterpret_cast<Shared*>(shared_bytes);
  const int group = heads / cache.num_kv_heads;
  const int positions_per_tile = kRows / group;
  const int kv_head = blockIdx.y;
  int seq = 0;
  int64_t first = 0;
  if (!locate_tile(batch, positions_per_tile, blockIdx.x, &seq, &first)) return;
  const int64_t row_base = batch.query_start[seq];
  const int64_t count = batch.query_start[seq + 1] - row_base;
  const int64_t context = batch.context_lens[seq];
  const int64_t base_position = context - count;  // position of the sequence's first new row
  const int64_t last = min(count, first + positions_per_tile) - 1;
  const int32_t* table = batch.block_tables + int64_t{seq} * batch.max_blocks_per_seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  start_tile(sh, q + (row_base + first) * heads * kDim, heads, kv_head, group, last - first, scale);
  // Keys any row of the tile may see: up to the last row's position, from the first row's
  // window start.
  const int64_t first_position = base_position + first;
  const int64_t last_position = base_position + last;
  const int64_t key_begin = window > 0 ? max(int64_t{0}, first_position - window + 1) : 0;
  // Each lane pair owns one row: lane / 2 its row in the warp's 16, lane % 2 its half of the
  // 64 key columns.
  const int row = warp * 16 + lane / 2, half = lane % 2;
  const int64_t row_position = base_position + first + row / group;
  const bool row_valid = first + row / group <= last;
  TileFetch<T> next;
  next.fetch(cache, table, key_begin / kKeys * kKeys, context, kv_head);
  for (int64_t key0 = key_begin / kKeys * kKeys; key0 <= last_position; key0 += kKeys) {
    __syncthreads();  // the previous step's K/V reads are done
    next.store(sh);
    __syncthreads();
    // The next tile's loads run while this one is computed.
    if (key0 + kKeys <= last_position) next.fetch(cache, table, key0 + kKeys, context, kv_head);
    scores(sh, warp);
    __syncwarp();
    online_softmax(sh, row, half, key0, row_position, row_valid, window);
    accumulate_values(sh, warp);
    __syncwarp();
  }
  if (!row_valid) return;
  const int head = kv_head * group + row % group;
  float* result =
      out + ((row_base + first + row / group) * heads + head) * kDim + half * (kDim / 2);
  const float inverse = 1.0f / sh.row_sum[row];
  const float* o = sh.o + row * kLdOut + half * (kDim / 2);
  for (int c = 0; c < kDim / 2; c += 4)
    *reinterpret_cast<float4*>(result + c) =
        make_float4(o[c] * inverse, o[c + 1] * inverse, o[c + 2] * inverse, o[c + 3] * inverse);
}

}  // namespace

bool flash_attention_supports(int heads, const PagedKvView& cache) {
  if (cache.key_dim != kDim || cache.value_dim != kDim || cache.values_in_keys) return false;
  if (heads % cache.num_kv_heads != 0) return false;
  const int group = heads / cache.num_kv_heads;
  return group <= kRows && kRows % group == 0;
}

void flash_attention(const float* q, int64_t rows, int heads, const AttentionBatch& batch,
                     const PagedKvView& cache, float scale, int window, float* out,
                     cudaStream_t stream) {
  if (!flash_attention_supports(heads, cache))
    fail("flash_attention: {} heads over {} KV heads of size {} / {}", heads, cache.num_kv_heads,
         cache.key_dim, cache.value_dim);
  if (rows == 0) return;
  static const bool configured = [] {
    cudaFuncSetAttribute(flash_attention_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(sizeof(Shared)));
    cudaFuncSetAttribute(flash_attention_kernel<__nv_bfloat16>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(sizeof(Shared)));
    return true;
  }();
  (void)configured;
  const int positions_per_tile = kRows / (heads / cache.num_kv_heads);
  // Every sequence's last tile may be partial: at most one more tile per sequence.
  const int64_t tiles = (rows + positions_per_tile - 1) / positions_per_tile + batch.num_seqs;
  dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(cache.num_kv_heads));
  if (cache.dtype == DType::kBF16) {
    flash_attention_kernel<__nv_bfloat16>
        <<<grid, kThreads, sizeof(Shared), stream>>>(q, heads, batch, cache, scale, window, out);
  } else {
    flash_attention_kernel<float>
        <<<grid, kThreads, sizeof(Shared), stream>>>(q, heads, batch, cache, scale, window, out);
  }
  check_launch("flash_attention");
}

}  // namespace deepinfer::cuda

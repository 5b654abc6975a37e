// Prompt attention on the tensor cores, flash-attention style: a block takes one tile of 64
// (query position, head) rows of a sequence, all heads of one KV head's group, and walks the
// sequence's paged keys 64 at a time. Each warp owns 16 rows and keeps everything of them in
// registers: Q as mma.sync A fragments, S = Q K^T in accumulators, the online softmax on
// those, P reused from them as the A operand of O += P V, and O itself; only K and V pass
// through shared memory, double-buffered so the next tile's copies run under this one's math.
#include <cuda_bf16.h>

#include <cfloat>
#include <cstring>

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kv_elements.cuh"
#include "kernels/cuda/mma.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kDim = 128;  // head size (keys and values)
constexpr int kRows = 64;  // (position, head) rows per tile
constexpr int kKeys = 64;  // keys per step
constexpr int kWarps = 4;  // each owns 16 rows
constexpr int kThreads = kWarps * 32;
// Rows of 136 bf16 (272 bytes): the eight rows an mma fragment or ldmatrix reads at once fall
// on distinct banks, and every 8-element chunk stays 16-byte aligned.
constexpr int kLdTile = kDim + 8;

struct Shared {
  __nv_bfloat16 q[kRows * kLdTile];
  __nv_bfloat16 k[2][kKeys * kLdTile];
  __nv_bfloat16 v[2][kKeys * kLdTile];
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

constexpr int kChunk = 8;                               // elements per 16-byte copy
constexpr int kChunksPerKey = kDim / kChunk;            // 16
constexpr int kKeysPerPass = kThreads / kChunksPerKey;  // 8
constexpr int kPasses = kKeys / kKeysPerPass;           // 8

// 16 bytes global -> shared without passing through registers; `bytes` 0 writes zeros.
__device__ inline void copy_async(void* shared, const void* global, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)),
               "l"(global), "r"(bytes));
}
__device__ inline void commit_copies() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ inline void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Keys [first_key, first_key + kKeys) into one shared K/V buffer; keys past the context
// become zeros (masked later). A bf16 cache is copied asynchronously; an f32 one (tests keep
// one) is rounded to bf16 on the way.
template <typename T>
__device__ void fetch_tile(const PagedKvView& cache, const int32_t* table, int64_t first_key,
                           int64_t context, int kv_head, __nv_bfloat16* k, __nv_bfloat16* v) {
  const int64_t key_stride = int64_t{cache.num_kv_heads} * kDim;
  const int column = (threadIdx.x % kChunksPerKey) * kChunk;
  const T* keys = static_cast<const T*>(cache.keys);
  const T* values = static_cast<const T*>(cache.values);
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = threadIdx.x / kChunksPerKey + pass * kKeysPerPass;
    const int64_t key = first_key + row;
    int64_t at = 0;
    if (key < context) {
      const int64_t slot =
          int64_t{table[key / cache.block_size]} * cache.block_size + key % cache.block_size;
      at = slot * key_stride + int64_t{kv_head} * kDim + column;
    }
    __nv_bfloat16* k_row = k + row * kLdTile + column;
    __nv_bfloat16* v_row = v + row * kLdTile + column;
    if constexpr (sizeof(T) == 2) {
      copy_async(k_row, keys + at, key < context ? 16 : 0);
      copy_async(v_row, values + at, key < context ? 16 : 0);
    } else {
      const uint4 zero = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(k_row) = key < context ? to_bf16_chunk(keys + at) : zero;
      *reinterpret_cast<uint4*>(v_row) = key < context ? to_bf16_chunk(values + at) : zero;
    }
  }
  commit_copies();
}

// Q rows of the tile (positions 0..last_index from `q`, all heads of the group), pre-scaled;
// rows past the sequence's queries are zeros and never written out.
__device__ void load_queries(Shared& sh, const float* q, int heads, int kv_head, int group,
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
}

// One warp's 16 rows through the walk over keys: this thread's share of them (rows g and
// g + 8 of the warp, columns 2t and 2t + 1 of every 8-wide tile).
struct WarpRows {
  uint32_t q[kDim / 16][4];  // A fragments of Q, one per 16 dims
  float o[kDim / 8][4];      // O accumulators, one per 8 dims
  float max[2] = {-FLT_MAX, -FLT_MAX};
  float sum[2] = {0.0f, 0.0f};  // this thread's columns only; the quad adds them at the end
  int64_t position[2];
  bool valid[2];
  int64_t first_key = 0;  // keys before it are absent (a replayed prefix's window start)
};

// S = Q K^T for the warp's rows: K's B fragments for two 16-dim chunks of an 8-key tile in
// one ldmatrix (lanes 8i..8i+7 address the tile's keys at dims 8i of the pair), each score
// still summed over the chunks in order.
__device__ void scores(const WarpRows& w, const __nv_bfloat16* k, int lane,
                       float (&s)[kKeys / 8][4]) {
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
  for (int c = 0; c < kDim / 16; c += 2) {
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j) {
      uint32_t b[4];
      load_fragments(b, k + (j * 8 + lane % 8) * kLdTile + c * 16 + (lane / 8) * 8);
      mma_bf16(s[j], w.q[c], b[0], b[1]);
      mma_bf16(s[j], w.q[c + 1], b[2], b[3]);
    }
  }
}

// Whether row r of this thread sees every key of the tile starting at key0.
__device__ inline bool sees_whole_tile(const WarpRows& w, int r, int64_t key0, int window) {
  return w.valid[r] && key0 + kKeys - 1 <= w.position[r] &&
         (window <= 0 || (key0 > w.position[r] - window && key0 >= w.first_key));
}

// Scores of keys a row may not see (past its position, outside its window, or a row past
// the queries) set to -FLT_MAX.
__device__ void mask_scores(const WarpRows& w, float (&s)[kKeys / 8][4], int64_t key0, int t,
                            int window) {
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      const int64_t key = key0 + j * 8 + 2 * t + e % 2;
      const bool visible = w.valid[r] && key <= w.position[r] &&
                           (window <= 0 || (key > w.position[r] - window && key >= w.first_key));
      s[j][e] = visible ? s[j][e] : -FLT_MAX;
    }
  }
}

// Masks what each row may not see (only tiles some row does not wholly see: in a long
// prompt most tiles lie below the diagonal), turns the scores into probabilities against
// the updated running maxima (in place) and rescales O and the sums.
__device__ void online_softmax(WarpRows& w, float (&s)[kKeys / 8][4], int64_t key0, int t,
                               int window) {
  if (!sees_whole_tile(w, 0, key0, window) || !sees_whole_tile(w, 1, key0, window))
    mask_scores(w, s, key0, t, window);
  float tile_max[2] = {-FLT_MAX, -FLT_MAX};
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) tile_max[e / 2] = fmaxf(tile_max[e / 2], s[j][e]);
  }
  float rescale[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    const float new_max = fmaxf(w.max[r], tile_max[r]);
    rescale[r] = new_max > -FLT_MAX ? __expf(w.max[r] - new_max) : 1.0f;
    w.max[r] = new_max;
    w.sum[r] *= rescale[r];
  }
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      s[j][e] = s[j][e] > -FLT_MAX ? __expf(s[j][e] - w.max[r]) : 0.0f;
      w.sum[r] += s[j][e];
    }
  }
#pragma unroll
  for (int n = 0; n < kDim / 8; ++n) {
    w.o[n][0] *= rescale[0];
    w.o[n][1] *= rescale[0];
    w.o[n][2] *= rescale[1];
    w.o[n][3] *= rescale[1];
  }
}

// O += P V: P's accumulators repacked as A fragments (two 8-key tiles make one 16-key chunk),
// V's fragments read transposed from shared memory, two 8-dim tiles per load.
__device__ void accumulate_values(WarpRows& w, const float (&p)[kKeys / 8][4],
                                  const __nv_bfloat16* v, int lane) {
#pragma unroll
  for (int c = 0; c < kKeys / 16; ++c) {
    const uint32_t a[4] = {pack(p[2 * c][0], p[2 * c][1]), pack(p[2 * c][2], p[2 * c][3]),
                           pack(p[2 * c + 1][0], p[2 * c + 1][1]),
                           pack(p[2 * c + 1][2], p[2 * c + 1][3])};
    const int key = c * 16 + ((lane / 8) % 2) * 8 + lane % 8;
#pragma unroll
    for (int n = 0; n < kDim / 16; ++n) {
      uint32_t b[4];
      load_transposed(b, v + key * kLdTile + n * 16 + (lane / 16) * 8);
      mma_bf16(w.o[2 * n], a, b[0], b[1]);
      mma_bf16(w.o[2 * n + 1], a, b[2], b[3]);
    }
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
  // Tiles in reverse: blocks start in index order (x fastest), so within each KV head the
  // tiles that see the most keys start first and the last head's short ones fill the tail.
  if (!locate_tile(batch, positions_per_tile, int64_t{gridDim.x} - 1 - blockIdx.x, &seq, &first))
    return;
  const int64_t row_base = batch.query_start[seq];
  const int64_t count = batch.query_start[seq + 1] - row_base;
  const int64_t context = batch.context_lens[seq];
  const int64_t base_position = context - count;  // position of the sequence's first new row
  const int64_t last = min(count, first + positions_per_tile) - 1;
  const int32_t* table = batch.block_tables + int64_t{seq} * batch.max_blocks_per_seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // Keys any row of the tile may see: up to the last row's position, from the first row's
  // window start.
  const int64_t last_position = base_position + last;
  const int64_t first_key =
      window > 0 && batch.first_positions ? int64_t{batch.first_positions[seq]} : 0;
  const int64_t key_begin =
      (window > 0 ? max(first_key, base_position + first - window + 1) : 0) / kKeys * kKeys;

  fetch_tile<T>(cache, table, key_begin, context, kv_head, sh.k[0], sh.v[0]);
  load_queries(sh, q + (row_base + first) * heads * kDim, heads, kv_head, group, last - first,
               scale);
  __syncthreads();
  WarpRows w;
  w.first_key = first_key;
  const int rows[2] = {warp * 16 + g, warp * 16 + g + 8};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    w.position[r] = base_position + first + rows[r] / group;
    w.valid[r] = first + rows[r] / group <= last;
  }
#pragma unroll
  for (int c = 0; c < kDim / 16; ++c) {
    w.q[c][0] = word(sh.q + rows[0] * kLdTile + c * 16 + 2 * t);
    w.q[c][1] = word(sh.q + rows[1] * kLdTile + c * 16 + 2 * t);
    w.q[c][2] = word(sh.q + rows[0] * kLdTile + c * 16 + 8 + 2 * t);
    w.q[c][3] = word(sh.q + rows[1] * kLdTile + c * 16 + 8 + 2 * t);
  }
#pragma unroll
  for (int n = 0; n < kDim / 8; ++n) w.o[n][0] = w.o[n][1] = w.o[n][2] = w.o[n][3] = 0.0f;

  int buffer = 0;
  for (int64_t key0 = key_begin; key0 <= last_position; key0 += kKeys, buffer ^= 1) {
    // The next tile's copies go out first; then this one's must have landed for every thread.
    if (key0 + kKeys <= last_position) {
      fetch_tile<T>(cache, table, key0 + kKeys, context, kv_head, sh.k[buffer ^ 1],
                    sh.v[buffer ^ 1]);
      wait_copies<1>();
    } else {
      wait_copies<0>();
    }
    __syncthreads();
    float s[kKeys / 8][4];
    scores(w, sh.k[buffer], lane, s);
    online_softmax(w, s, key0, t, window);
    accumulate_values(w, s, sh.v[buffer], lane);
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float total = w.sum[r];
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    if (!w.valid[r]) continue;
    const float inverse = 1.0f / total;
    const int head = kv_head * group + rows[r] % group;
    float* result = out + ((row_base + first + rows[r] / group) * heads + head) * kDim + 2 * t;
#pragma unroll
    for (int n = 0; n < kDim / 8; ++n)
      *reinterpret_cast<float2*>(result + n * 8) =
          make_float2(w.o[n][2 * r] * inverse, w.o[n][2 * r + 1] * inverse);
  }
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

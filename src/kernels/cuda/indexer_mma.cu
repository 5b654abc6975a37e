// The lightning indexer's scores for many rows on the tensor cores. A row's score of compressed
// entry w is scale * sum over heads h of weight[h] * relu(q[h] . key[w]): one product of the
// row's queries [heads, dim] with the keys of its visible entries. A block takes one row and
// a run of its entries: the queries stay in shared memory as bf16, the keys pass through it 64
// at a time, eight warps run S = Q K^T with mma.sync, and the weighted ReLU sum over heads
// happens in registers, then across the four head tiles in a fixed order.
#include <cuda_bf16.h>

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/deepseek_v4_kernels.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/v4_rows.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kHeads = 64;               // heads a block holds: four 16-row tiles
constexpr int kKeys = 64;                // entries a tile
constexpr int kEntriesPerBlock = 512;    // entries a block scores (eight tiles)
constexpr int kThreads = 256;            // 4 head tiles x 2 halves of the tile's entries
constexpr int kMaxDim = 256;             // shared memory for queries and keys of this size
constexpr int kMinRows = 128;            // fewer rows (decodes) keep the f32 kernel
constexpr int kHeadTiles = kHeads / 16;  // partial sums a tile's entry gets

struct Layout {
  int stride;  // bf16 a query or key row: dim + 8 puts an ldmatrix's eight rows on distinct banks
  size_t keys, partial, weights, bytes;
  __host__ __device__ explicit Layout(int dim) : stride(dim + 8) {
    keys = sizeof(__nv_bfloat16) * kHeads * stride;
    partial = keys + sizeof(__nv_bfloat16) * kKeys * stride;
    weights = partial + sizeof(float) * kHeadTiles * kKeys;
    bytes = weights + sizeof(float) * kHeads;
  }
};

// The row's queries and head weights into shared memory; heads past `heads` are zeros, which
// add nothing to a score.
__device__ void load_queries(const float* queries, const float* head_weights, int64_t t, int heads,
                             int dim, int stride, __nv_bfloat16* q, float* weights) {
  for (int i = threadIdx.x; i < kHeads * (dim / 4); i += kThreads) {
    const int h = i / (dim / 4), c = (i % (dim / 4)) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (h < heads) v = *reinterpret_cast<const float4*>(queries + (t * heads + h) * dim + c);
    store_bf16x4(q + h * stride + c, v);
  }
  for (int h = threadIdx.x; h < kHeads; h += kThreads)
    weights[h] = h < heads ? head_weights[t * heads + h] : 0.0f;
}

// Keys of entries [base, base + kKeys) as bf16, a warp an entry; entries at or past `last`
// are zeros (their scores are not written).
__device__ void gather_index_keys(const DeviceStripes& entries, bool vectorised, int seq,
                                  int64_t base, int64_t last, int64_t key_offset, int dim,
                                  int stride, __nv_bfloat16* keys) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < kKeys; r += kThreads / 32) {
    const int64_t w = base + r;
    for (int c = lane * 4; c < dim; c += 128) {
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (w < last) v = entry_quad(entries, vectorised, seq, w, key_offset + c);
      store_bf16x4(keys + r * stride + c, v);
    }
  }
}

// This warp's 16 heads x 32 entries of S = Q K^T, weighted by ReLU and summed over its heads
// into partial[head tile][entry].
__device__ void tile_partial_scores(const __nv_bfloat16* q, const __nv_bfloat16* keys, int stride,
                                    int dim, const float* weights, float* partial) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head0 = (warp % 4) * 16, key0 = (warp / 4) * 32;
  float s[4][4] = {};
  warp_scores(q, keys, stride, dim, head0, key0, s);
  // A lane holds heads g and g + 8 at entries 2t and 2t + 1 of each 8-entry tile; the lanes of
  // one t (lane bits 2..4 are g) add their heads together.
  const int g = lane / 4, t = lane % 4;
  const float low = weights[head0 + g], high = weights[head0 + g + 8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float even = low * fmaxf(s[j][0], 0.0f) + high * fmaxf(s[j][2], 0.0f);
    float odd = low * fmaxf(s[j][1], 0.0f) + high * fmaxf(s[j][3], 0.0f);
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2) {
      even += __shfl_xor_sync(0xffffffffu, even, offset);
      odd += __shfl_xor_sync(0xffffffffu, odd, offset);
    }
    if (g == 0) {
      float* at = partial + (warp % 4) * kKeys + key0 + j * 8 + 2 * t;
      at[0] = even;
      at[1] = odd;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    index_scores_mma_kernel(const float* queries, const float* head_weights, int heads, int dim,
                            float scale, DeviceRows rows, DeviceStripes entries, bool vectorised,
                            int64_t key_offset, int64_t max_visible, float* scores) {
  extern __shared__ __align__(16) unsigned char raw[];
  const Layout layout(dim);
  auto* q = reinterpret_cast<__nv_bfloat16*>(raw);
  auto* keys = reinterpret_cast<__nv_bfloat16*>(raw + layout.keys);
  auto* partial = reinterpret_cast<float*>(raw + layout.partial);
  auto* weights = reinterpret_cast<float*>(raw + layout.weights);
  const int64_t t = blockIdx.x;
  int seq;
  int64_t position;
  place_of(rows, t, seq, position);
  const int64_t visible = (position + 1) / entries.rate;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * kEntriesPerBlock;
  if (first >= visible) return;
  const int64_t last = min(visible, first + kEntriesPerBlock);
  load_queries(queries, head_weights, t, heads, dim, layout.stride, q, weights);
  for (int64_t base = first; base < last; base += kKeys) {
    gather_index_keys(entries, vectorised, seq, base, last, key_offset, dim, layout.stride, keys);
    __syncthreads();
    tile_partial_scores(q, keys, layout.stride, dim, weights, partial);
    __syncthreads();
    for (int r = threadIdx.x; r < kKeys && base + r < last; r += kThreads) {
      float sum = 0.0f;
#pragma unroll
      for (int tile = 0; tile < kHeadTiles; ++tile) sum += partial[tile * kKeys + r];
      scores[t * max_visible + base + r] = sum * scale;
    }
    // The next tile's keys and partial sums wait for the readers above.
    __syncthreads();
  }
}

}  // namespace

bool index_scores_on_tensor_cores(int64_t tokens, int heads, int dim) {
  return heads <= kHeads && dim % 16 == 0 && dim <= kMaxDim && tokens >= kMinRows;
}

void index_scores_mma(const float* queries, const float* head_weights, int64_t tokens, int heads,
                      int dim, float scale, DeviceRows rows, DeviceStripes entries,
                      int64_t key_offset, int64_t max_visible, float* scores, cudaStream_t stream) {
  const int64_t blocks =
      (std::max<int64_t>(max_visible, 1) + kEntriesPerBlock - 1) / kEntriesPerBlock;
  if (tokens > 0x7fffffff || blocks > 65535)
    fail("index_select: {} rows of {} entries in one batch", tokens, max_visible);
  const Layout layout(dim);
  cudaFuncSetAttribute(index_scores_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(layout.bytes));
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(blocks));
  index_scores_mma_kernel<<<grid, kThreads, layout.bytes, stream>>>(
      queries, head_weights, heads, dim, scale, rows, entries,
      stripes_vectorised(entries, key_offset), key_offset, max_visible, scores);
  check_launch("index_select (tensor cores)");
}

}  // namespace deepinfer::cuda

// DeepSeek-V4's sparse attention for many rows on the tensor cores. Each query row attends to
// keys of its own (its window rows and the compressed entries the indexer chose for it), but
// every head of the row reads the same keys (one K=V head). So a block takes one row and 64 of
// its heads: the row's keys pass through shared memory as bf16, 64 at a time, and eight warps
// run S = Q K^T, the online softmax (started by the sinks) and O += P V with mma.sync, O kept
// in registers.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/deepseek_v4_kernels.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/v4_rows.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kHeads = 64;  // heads a block: four 16-row tiles
constexpr int kKeys = 64;   // keys a tile
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;    // 4 head tiles x 2 halves (of the keys for S, of O's dims)
constexpr int kScoreStride = kKeys + 4;  // f32 scores a head; the padding spreads the banks
constexpr int kProbStride = kKeys + 8;   // bf16 probabilities a head, rows 16-byte aligned
// Blocks (rows x head groups) from which the tensor cores beat the split scalar kernel: with
// fewer, most of the GPU would idle while each block walks its keys. Rows of many heads (a
// decode batch of DeepSeek-V4's 64) gain from far fewer: the scalar kernel reads a row's keys
// once per eight heads, a tensor-core block once for all of them (V4-Flash-shaped batch-64
// step at 8k, H100: 20.2 -> 12.5 ms).
constexpr int64_t kMinBlocks = 128;
constexpr int64_t kMinBlocksOfWideRows = 32;
constexpr int kWideRowHeads = 32;

// Shared memory, laid out for head size `dim`: Q and the key tile in rows of dim + 8 bf16 (the
// eight rows an ldmatrix reads fall on distinct banks), scores, probabilities, and per head
// the factor this tile rescales O by and the final sum; per key 0 or -inf.
struct Layout {
  int stride;
  size_t queries, keys, scores, probs, rescale, sums, mask, bytes;
  __host__ __device__ explicit Layout(int dim) : stride(dim + 8) {
    queries = 0;
    keys = queries + sizeof(__nv_bfloat16) * kHeads * stride;
    scores = keys + sizeof(__nv_bfloat16) * kKeys * stride;
    probs = scores + sizeof(float) * kHeads * kScoreStride;
    rescale = probs + sizeof(__nv_bfloat16) * kHeads * kProbStride;
    sums = rescale + sizeof(float) * kHeads;
    mask = sums + sizeof(float) * kHeads;
    bytes = mask + sizeof(float) * kKeys;
  }
};

// What one row reads: its window rows, then its entries (the chosen ones or every causal one).
struct RowKeys {
  int seq;
  int64_t t, first;  // the row, its first window position
  int window_count, total;
};

// Keys [base, base + kKeys) of the row into shared memory as bf16, a warp a key at a time;
// keys past the row's or unchosen entries (-1) become zeros masked by -inf.
__device__ void gather_keys(const RowKeys& row, int base, int dim, const int32_t* table,
                            const float* window_keys, int block_size, const DeviceStripes& entries,
                            bool vectorised, const int32_t* selected, int k, __nv_bfloat16* keys,
                            int stride, float* mask) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < kKeys; r += kWarps) {
    const int j = base + r;
    const float* window_row = nullptr;
    int64_t w = -1;
    if (j < row.window_count) {
      const int64_t p = row.first + j;
      window_row = window_keys +
                   (int64_t{table[p / block_size]} * block_size + p % block_size) * int64_t{dim};
    } else if (j < row.total) {
      w = selected ? selected[row.t * k + (j - row.window_count)] : j - row.window_count;
    }
    const bool present = window_row != nullptr || w >= 0;
    for (int c = lane * 4; c < dim; c += 128) {
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (window_row) {
        v = *reinterpret_cast<const float4*>(window_row + c);
      } else if (present) {
        v = entry_quad(entries, vectorised, row.seq, w, c);
      }
      store_bf16x4(keys + r * stride + c, v);
    }
    if (lane == 0) mask[r] = present ? 0.0f : -INFINITY;
  }
}

// S = Q K^T for this warp's 16 heads and 32 keys of the tile, scaled and masked into `scores`.
__device__ void tile_scores(const __nv_bfloat16* queries, const __nv_bfloat16* keys, int stride,
                            int dim, float scale, const float* mask, float* scores) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head0 = (warp % 4) * 16, key0 = (warp / 4) * 32;
  float s[4][4] = {};
  warp_scores(queries, keys, stride, dim, head0, key0, s);
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int key = key0 + j * 8 + 2 * t;
    float* low = scores + (head0 + g) * kScoreStride + key;
    float* high = low + 8 * kScoreStride;
    low[0] = s[j][0] * scale + mask[key];
    low[1] = s[j][1] * scale + mask[key + 1];
    high[0] = s[j][2] * scale + mask[key];
    high[1] = s[j][3] * scale + mask[key + 1];
  }
}

// The online softmax of one head's scores over the tile, four threads a head (16 keys each):
// probabilities as bf16 into `probs`, the running max and sum updated, and the factor O's
// rows scale by into `rescale`.
__device__ void tile_softmax(const float* scores, __nv_bfloat16* probs, float* rescale, float& top,
                             float& sum) {
  const int head = threadIdx.x / 4, quarter = threadIdx.x % 4;
  const float* row = scores + head * kScoreStride + quarter * 16;
  float tile_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < 16; ++i) tile_max = fmaxf(tile_max, row[i]);
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
  const float next = fmaxf(top, tile_max);  // top is finite: the sink started it
  float part = 0.0f;
  uint32_t* out = reinterpret_cast<uint32_t*>(probs + head * kProbStride + quarter * 16);
#pragma unroll
  for (int i = 0; i < 16; i += 2) {
    const float p0 = __expf(row[i] - next), p1 = __expf(row[i + 1] - next);
    part += p0 + p1;
    out[i / 2] = pack(p0, p1);
  }
  part += __shfl_xor_sync(0xffffffffu, part, 1);
  part += __shfl_xor_sync(0xffffffffu, part, 2);
  const float keep = __expf(top - next);
  sum = sum * keep + part;
  top = next;
  if (quarter == 0) rescale[head] = keep;
}

// O = O * rescale + P V for this warp's 16 heads and half of the dims.
template <int kMaxDim>
__device__ void accumulate_values(float (&o)[kMaxDim / 16][4], const __nv_bfloat16* probs,
                                  const __nv_bfloat16* keys, int stride, int dim,
                                  const float* rescale) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head0 = (warp % 4) * 16, column0 = (warp / 4) * (dim / 2);
  const int tiles = dim / 16;  // 8-wide O tiles in half of the dims
  const float keep_low = rescale[head0 + lane / 4], keep_high = rescale[head0 + lane / 4 + 8];
#pragma unroll
  for (int n = 0; n < kMaxDim / 16; ++n) {
    o[n][0] *= keep_low;
    o[n][1] *= keep_low;
    o[n][2] *= keep_high;
    o[n][3] *= keep_high;
  }
#pragma unroll
  for (int c = 0; c < kKeys; c += 16) {
    uint32_t a[4];
    load_fragments(a, probs + (head0 + lane % 16) * kProbStride + c + (lane / 16) * 8);
    const int key = c + lane % 8 + ((lane / 8) % 2) * 8;
#pragma unroll
    for (int n = 0; n < kMaxDim / 16; n += 2) {
      if (n >= tiles) break;
      // Matrices (transposed): keys c..c+7 and c+8..c+15 at dims n * 8, then at n * 8 + 8.
      uint32_t b[4];
      load_transposed(b, keys + key * stride + column0 + n * 8 + (lane / 16) * 8);
      mma_bf16(o[n], a, b[0], b[1]);
      mma_bf16(o[n + 1], a, b[2], b[3]);
    }
  }
}

template <int kMaxDim>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_attention_mma_kernel(const float* q, int heads, int dim, DeviceRows rows,
                                const int32_t* window_tables, int max_blocks,
                                const float* window_keys, int block_size, int window,
                                DeviceStripes entries, bool vectorised, const int32_t* selected,
                                int k, const float* sinks, float scale, float* out) {
  extern __shared__ __align__(16) unsigned char raw[];
  const Layout layout(dim);
  auto* queries = reinterpret_cast<__nv_bfloat16*>(raw + layout.queries);
  auto* keys = reinterpret_cast<__nv_bfloat16*>(raw + layout.keys);
  auto* scores = reinterpret_cast<float*>(raw + layout.scores);
  auto* probs = reinterpret_cast<__nv_bfloat16*>(raw + layout.probs);
  auto* rescale = reinterpret_cast<float*>(raw + layout.rescale);
  auto* sums = reinterpret_cast<float*>(raw + layout.sums);
  auto* mask = reinterpret_cast<float*>(raw + layout.mask);

  RowKeys row;
  row.t = blockIdx.x;
  int64_t position;
  place_of(rows, row.t, row.seq, position);
  row.first = window_first(rows, row.seq, position, window);
  row.window_count = static_cast<int>(position - row.first + 1);
  const int64_t visible = entries.rate > 0 ? (position + 1) / entries.rate : 0;
  row.total = row.window_count + (selected ? k : static_cast<int>(visible));
  const int32_t* table = window_tables + static_cast<int64_t>(row.seq) * max_blocks;
  const int head0 = blockIdx.y * kHeads;

  for (int i = threadIdx.x; i < kHeads * (dim / 4); i += kThreads) {
    const int h = i / (dim / 4), c = (i % (dim / 4)) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (head0 + h < heads)
      v = *reinterpret_cast<const float4*>(q + (row.t * heads + head0 + h) * dim + c);
    store_bf16x4(queries + h * layout.stride + c, v);
  }
  // The softmax state of head threadIdx.x / 4: the sink starts it at exp(sink - sink) = 1.
  const int softmax_head = head0 + static_cast<int>(threadIdx.x) / 4;
  float top = softmax_head < heads ? sinks[softmax_head] : 0.0f;
  float sum = 1.0f;
  float o[kMaxDim / 16][4] = {};
  for (int base = 0; base < row.total; base += kKeys) {
    gather_keys(row, base, dim, table, window_keys, block_size, entries, vectorised, selected, k,
                keys, layout.stride, mask);
    __syncthreads();
    tile_scores(queries, keys, layout.stride, dim, scale, mask, scores);
    __syncthreads();
    tile_softmax(scores, probs, rescale, top, sum);
    __syncthreads();
    accumulate_values<kMaxDim>(o, probs, keys, layout.stride, dim, rescale);
    __syncthreads();  // the next tile overwrites the keys and scores
  }
  if (threadIdx.x % 4 == 0) sums[threadIdx.x / 4] = sum;
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int local = (warp % 4) * 16 + lane / 4;
  const int column0 = (warp / 4) * (dim / 2) + 2 * (lane % 4);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int h = local + half * 8;
    if (head0 + h >= heads) continue;
    const float inverse = 1.0f / sums[h];
    float* target = out + (row.t * heads + head0 + h) * dim + column0;
#pragma unroll
    for (int n = 0; n < kMaxDim / 16; ++n) {
      if (n >= dim / 16) break;
      *reinterpret_cast<float2*>(target + n * 8) =
          make_float2(o[n][2 * half] * inverse, o[n][2 * half + 1] * inverse);
    }
  }
}

template <int kMaxDim>
void launch(const float* q, int64_t tokens, int heads, int dim, DeviceRows rows,
            const int32_t* window_tables, int max_blocks_per_seq, const float* window_keys,
            int block_size, int window, DeviceStripes entries, const int32_t* selected, int k,
            const float* sinks, float scale, float* out, cudaStream_t stream) {
  const Layout layout(dim);
  cudaFuncSetAttribute(sparse_attention_mma_kernel<kMaxDim>,
                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(layout.bytes));
  const bool vectorised = entries.rate == 0 || stripes_vectorised(entries, 0);
  const dim3 grid(static_cast<unsigned>(tokens),
                  static_cast<unsigned>((heads + kHeads - 1) / kHeads));
  sparse_attention_mma_kernel<kMaxDim><<<grid, kThreads, layout.bytes, stream>>>(
      q, heads, dim, rows, window_tables, max_blocks_per_seq, window_keys, block_size, window,
      entries, vectorised, selected, k, sinks, scale, out);
  check_launch("sparse_attention (tensor cores)");
}

}  // namespace

bool sparse_attention_on_tensor_cores(int64_t tokens, int heads, int dim) {
  const int64_t blocks = tokens * ((heads + kHeads - 1) / kHeads);
  return dim % 32 == 0 && dim <= 512 &&
         (blocks >= kMinBlocks || (heads >= kWideRowHeads && blocks >= kMinBlocksOfWideRows));
}

void sparse_attention_mma(const float* q, int64_t tokens, int heads, int dim, DeviceRows rows,
                          const int32_t* window_tables, int max_blocks_per_seq,
                          const float* window_keys, int block_size, int window,
                          DeviceStripes entries, const int32_t* selected, int k, const float* sinks,
                          float scale, float* out, cudaStream_t stream) {
  if (tokens > 0x7fffffff) fail("sparse_attention: {} rows in one batch", tokens);
  // The accumulators a thread keeps are sized for the largest head the instance takes.
  auto run = [&](auto instance) {
    launch<decltype(instance)::value>(q, tokens, heads, dim, rows, window_tables,
                                      max_blocks_per_seq, window_keys, block_size, window, entries,
                                      selected, k, sinks, scale, out, stream);
  };
  if (dim <= 64) {
    run(std::integral_constant<int, 64>{});
  } else if (dim <= 128) {
    run(std::integral_constant<int, 128>{});
  } else if (dim <= 256) {
    run(std::integral_constant<int, 256>{});
  } else {
    run(std::integral_constant<int, 512>{});
  }
}

}  // namespace deepinfer::cuda

#include <algorithm>
#include <cfloat>

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/deepseek_v4_kernels.h"
#include "kernels/cuda/v4_rows.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Sum over the block (every thread gets it); `scratch` holds kWarps floats.
__device__ float block_sum(float value, float* scratch) {
  value = warp_sum(value);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = value;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

__device__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// Hyper-connections in four launches, each spread over the whole GPU even for one token:
// partial products of the flattened streams with fn (a chunk of the streams by a tile of
// tokens a block), the mix of each token from those partials, the collapse and the residual
// update (a slice of the hidden width a block). Every sum runs in an order fixed by the token's
// own data, so a token's result does not depend on the batch around it.
constexpr int kHcChunk = 256;    // flattened stream elements a partials block reads
constexpr int kHcTokenTile = 8;  // tokens a partials block shares each fn load between
constexpr int kHcSharedFloats = 48 * 1024 / static_cast<int>(sizeof(float));

int hc_chunks(int64_t flat) {
  return static_cast<int>((flat + kHcChunk - 1) / kHcChunk);
}

// partials[token][chunk][r] for r < mixes: fn row r times the token's streams over the chunk;
// [mixes]: the sum of the chunk's squares.
__global__ void __launch_bounds__(kThreads)
    hc_partials_kernel(const float* streams, int64_t tokens, int64_t flat, const float* fn,
                       int mixes, float* partials) {
  __shared__ float xs[kHcTokenTile][kHcChunk];
  __shared__ float scratch[kWarps];
  const int chunks = gridDim.x, chunk = blockIdx.x;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * kHcTokenTile;
  const int tile = static_cast<int>(min(static_cast<int64_t>(kHcTokenTile), tokens - first));
  const int64_t begin = static_cast<int64_t>(chunk) * kHcChunk;
  const int len = static_cast<int>(min(static_cast<int64_t>(kHcChunk), flat - begin));
  for (int u = 0; u < kHcTokenTile; ++u) {
    float squares = 0.0f;
    for (int i = threadIdx.x; i < kHcChunk; i += blockDim.x) {
      const float v = u < tile && i < len ? streams[(first + u) * flat + begin + i] : 0.0f;
      xs[u][i] = v;
      squares += v * v;
    }
    squares = block_sum(squares, scratch);
    if (u < tile && threadIdx.x == 0)
      partials[((first + u) * chunks + chunk) * (mixes + 1) + mixes] = squares;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < mixes; r += kWarps) {
    const float* row = fn + static_cast<int64_t>(r) * flat + begin;
    float dots[kHcTokenTile] = {};
#pragma unroll 8
    for (int i = lane; i < len; i += 32) {
      const float w = row[i];
      for (int u = 0; u < kHcTokenTile; ++u) dots[u] += w * xs[u][i];
    }
    for (int u = 0; u < tile; ++u) {
      const float dot = warp_sum(dots[u]);
      if (lane == 0) partials[((first + u) * chunks + chunk) * (mixes + 1) + r] = dot;
    }
  }
}

// Up to a warp's worth of streams, the comb is normalised by the first warp alone (the others
// have left): warp barriers instead of block ones between its steps.
__device__ void hc_sync(int n) {
  if (n <= 32) {
    __syncwarp();
  } else {
    __syncthreads();
  }
}

// Rows (or, transposed, columns) of the n x n comb divided by their sums plus eps, a row or
// column a thread.
__device__ void hc_normalize(float* comb, int n, bool rows, float eps) {
  for (int a = threadIdx.x; a < n; a += blockDim.x) {
    float sum = 0.0f;
    for (int b = 0; b < n; ++b) sum += rows ? comb[a * n + b] : comb[b * n + a];
    for (int b = 0; b < n; ++b) (rows ? comb[a * n + b] : comb[b * n + a]) /= sum + eps;
  }
  hc_sync(n);
}

// The Sinkhorn normalisation of an n x n comb with n * n <= 32 in one warp's registers,
// element (j, k) in lane j * n + k: each sum gathers its row or column by shuffles in the
// order the CPU adds them, and every lane divides its own element.
__device__ void hc_sinkhorn_in_registers(float* comb, int n, int iterations, float eps) {
  const int lane = threadIdx.x % 32, j = lane / n, k = lane % n;
  float v = lane < n * n ? comb[lane] : 0.0f;
  auto line_sum = [&](bool row) {
    float sum = 0.0f;
    for (int b = 0; b < n; ++b) sum += __shfl_sync(0xffffffffu, v, row ? j * n + b : b * n + k);
    return sum;
  };
  float top = -FLT_MAX;
  for (int b = 0; b < n; ++b) top = fmaxf(top, __shfl_sync(0xffffffffu, v, j * n + b));
  v = expf(v - top);
  v = v / line_sum(true) + eps;
  v /= line_sum(false) + eps;
  for (int it = 1; it < iterations; ++it) {
    v /= line_sum(true) + eps;
    v /= line_sum(false) + eps;
  }
  if (lane < n * n) comb[lane] = v;
}

// One block per token: the logits from the partials (a warp per logit, its lanes over the
// chunks), pre (for the collapse) and, with `mix`, post and the Sinkhorn-normalised comb (a
// row softmax plus eps, a column normalisation, then iterations - 1 row and column pairs).
// Dynamic shared memory: mixes + 1 floats.
__global__ void hc_mix_kernel(const float* partials, int chunks, int64_t flat, const float* base,
                              const float* scale, int n, int mixes, int iterations, float eps,
                              float norm_eps, float* pre, float* mix) {
  extern __shared__ float logits[];
  const int64_t t = blockIdx.x;
  const float* p = partials + t * chunks * (mixes + 1);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r <= mixes; r += kWarps) {
    float sum = 0.0f;
    for (int c = lane; c < chunks; c += 32) sum += p[c * (mixes + 1) + r];
    sum = warp_sum(sum);
    if (lane == 0) logits[r] = sum;
  }
  __syncthreads();
  const float factor = rsqrtf(logits[mixes] / static_cast<float>(flat) + norm_eps);
  float* m = mix ? mix + t * mixes : nullptr;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float value = sigmoid(logits[j] * factor * scale[0] + base[j]) + eps;
    pre[t * n + j] = value;
    if (m) {
      m[j] = value;
      m[n + j] = 2.0f * sigmoid(logits[n + j] * factor * scale[1] + base[n + j]);
    }
  }
  if (!m || (n <= 32 && warp > 0)) return;
  float* comb = logits + 2 * n;
  for (int i = threadIdx.x; i < n * n; i += blockDim.x)
    comb[i] = comb[i] * factor * scale[2] + base[2 * n + i];
  hc_sync(n);
  if (n * n <= 32) {
    hc_sinkhorn_in_registers(comb, n, iterations, eps);
    __syncwarp();
    for (int i = threadIdx.x; i < n * n; i += blockDim.x) m[2 * n + i] = comb[i];
    return;
  }
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    float* row = comb + j * n;
    float top = -FLT_MAX, sum = 0.0f;
    for (int k = 0; k < n; ++k) top = fmaxf(top, row[k]);
    for (int k = 0; k < n; ++k) sum += row[k] = expf(row[k] - top);
    for (int k = 0; k < n; ++k) row[k] = row[k] / sum + eps;
  }
  hc_sync(n);
  hc_normalize(comb, n, false, eps);
  for (int it = 1; it < iterations; ++it) {
    hc_normalize(comb, n, true, eps);
    hc_normalize(comb, n, false, eps);
  }
  for (int i = threadIdx.x; i < n * n; i += blockDim.x) m[2 * n + i] = comb[i];
}

// collapsed[t][i] = sum over streams j of pre[t][j] * streams[t][j][i]; an element a thread.
__global__ void hc_collapse_kernel(const float* streams, int64_t width, const float* pre, int n,
                                   float* collapsed) {
  const int64_t t = blockIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= width) return;
  const float* x = streams + t * n * width + i;
  float c = 0.0f;
  for (int j = 0; j < n; ++j) c += pre[t * n + j] * x[j * width];
  collapsed[t * width + i] = c;
}

// Stream k of token t becomes post[k] * out + sum over j of comb[j][k] * stream j, in place:
// each thread keeps its element's old streams in dynamic shared memory (n * blockDim floats).
__global__ void hc_post_kernel(const float* out, const float* mix, int64_t width, int n,
                               float* streams) {
  extern __shared__ float old[];
  const int64_t t = blockIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= width) return;
  const float* m = mix + t * (2 + n) * n;
  const float* post = m + n;
  const float* comb = m + 2 * n;
  float* x = streams + t * n * width + i;
  float* mine = old + threadIdx.x;
  for (int j = 0; j < n; ++j) mine[j * blockDim.x] = x[j * width];
  const float y = out[t * width + i];
  for (int k = 0; k < n; ++k) {
    float value = post[k] * y;
    for (int j = 0; j < n; ++j) value += comb[j * n + k] * mine[j * blockDim.x];
    x[k * width] = value;
  }
}

__global__ void write_records_kernel(const float* values, int64_t width, DeviceRows rows,
                                     DeviceRecords records) {
  const int64_t t = blockIdx.x;
  int seq;
  int64_t position;
  place_of(rows, t, seq, position);
  for (int64_t e = threadIdx.x; e < width; e += blockDim.x)
    *record_at(records, seq, position, e) = values[t * width + e];
}

// One block per window: per channel a softmax over the slots' gates (two passes, as the
// CPU), the weighted RMSNorm, the rope of the trailing dims, then the stripes.
__global__ void compress_kernel(DeviceRecords inputs, Compressor c, const float* bias,
                                const float* norm, const int32_t* windows, const float* cos,
                                const float* sin, DeviceStripes entries) {
  extern __shared__ float entry[];  // [width]
  __shared__ float scratch[kWarps];
  const int seq = windows[2 * blockIdx.x];
  if (seq < 0) return;  // a recorded step's row that completes no window
  const int64_t w = windows[2 * blockIdx.x + 1];
  const int width = c.width, projected = c.overlapping ? 2 * c.width : c.width, rate = c.rate;
  auto slot = [&](int s, int ch, float& value, float& gate) {
    // Slots [0, rate) are window w - 1's first halves (overlapping only), then window w's.
    const bool previous = c.overlapping && s < rate;
    const int64_t window = previous ? w - 1 : w;
    const int i = c.overlapping ? s % rate : s;
    const int half = c.overlapping && !previous ? width : 0;
    const int64_t position = window * rate + i;
    value = *record_at(inputs, seq, position, c.input_offset + half + ch);
    gate = *record_at(inputs, seq, position, c.input_offset + projected + half + ch) +
           bias[i * projected + half + ch];
  };
  const int first = c.overlapping && w == 0 ? rate : 0;
  const int slots = c.overlapping ? 2 * rate : rate;
  float squares = 0.0f;
  for (int ch = threadIdx.x; ch < width; ch += blockDim.x) {
    float top = -FLT_MAX, value, gate;
    for (int s = first; s < slots; ++s) {
      slot(s, ch, value, gate);
      top = fmaxf(top, gate);
    }
    float sum = 0.0f, pooled = 0.0f;
    for (int s = first; s < slots; ++s) {
      slot(s, ch, value, gate);
      const float e = expf(gate - top);
      sum += e;
      pooled += e * value;
    }
    entry[ch] = pooled / sum;
    squares += entry[ch] * entry[ch];
  }
  const float factor = rsqrtf(block_sum(squares, scratch) / static_cast<float>(width) + c.eps);
  for (int ch = threadIdx.x; ch < width; ch += blockDim.x) entry[ch] *= factor * norm[ch];
  __syncthreads();
  const int half_rope = c.rope_dims / 2;
  float* tail = entry + width - c.rope_dims;
  for (int i = threadIdx.x; i < half_rope; i += blockDim.x) {
    const float co = cos[blockIdx.x * half_rope + i];
    const float si = sin[blockIdx.x * half_rope + i];
    const float a = tail[2 * i], b = tail[2 * i + 1];
    tail[2 * i] = a * co - b * si;
    tail[2 * i + 1] = b * co + a * si;
  }
  __syncthreads();
  for (int ch = threadIdx.x; ch < width; ch += blockDim.x)
    *entry_at(entries, seq, w, c.entry_offset + ch) = entry[ch];
}

// Floats ordered as unsigned integers (larger float, larger key).
__device__ uint32_t order_key(float value) {
  const uint32_t bits = __float_as_uint(value);
  return bits & 0x80000000u ? ~bits : bits | 0x80000000u;
}

constexpr int kEntriesPerScoreBlock = 64;

// Scores of a row's visible entries, kEntriesPerScoreBlock entries a block (grid: rows x
// entry chunks): the row's queries sit in shared memory (rows padded by one float against
// bank conflicts), a warp takes an entry, stages its key and its lanes take heads.
__global__ void index_scores_kernel(const float* queries, const float* head_weights, int heads,
                                    int dim, float scale, DeviceRows rows, DeviceStripes entries,
                                    int64_t key_offset, int64_t max_visible, float* scores) {
  extern __shared__ float shared[];  // queries [heads][dim + 1], then a key per warp [dim]
  float* q = shared;
  float* keys = shared + heads * (dim + 1);
  const int64_t t = blockIdx.x;
  int seq;
  int64_t position;
  place_of(rows, t, seq, position);
  const int64_t visible = (position + 1) / entries.rate;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * kEntriesPerScoreBlock;
  if (first >= visible) return;
  for (int i = threadIdx.x; i < heads * dim; i += blockDim.x)
    q[(i / dim) * (dim + 1) + i % dim] = queries[t * heads * dim + i];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* key = keys + warp * dim;
  const int64_t last = min(visible, first + kEntriesPerScoreBlock);
  for (int64_t w = first + warp; w < last; w += kWarps) {
    for (int i = lane; i < dim; i += 32) key[i] = *entry_at(entries, seq, w, key_offset + i);
    __syncwarp();
    float score = 0.0f;
    for (int h = lane; h < heads; h += 32) {
      const float* qh = q + h * (dim + 1);
      float d = 0.0f;
      for (int i = 0; i < dim; ++i) d += qh[i] * key[i];
      score += head_weights[t * heads + h] * fmaxf(0.0f, d);
    }
    score = warp_sum(score);
    if (lane == 0) scores[t * max_visible + w] = score * scale;
    __syncwarp();
  }
}

// One block per row: the k-th largest score by a radix select, then a warp writes the chosen
// indices in index order (ties at the threshold to the lower index).
__global__ void index_topk_kernel(DeviceRows rows, int rate, int k, int64_t max_visible,
                                  const float* scores, int32_t* selected) {
  __shared__ float scratch[kWarps];
  __shared__ uint32_t threshold;
  __shared__ int remaining;
  const int64_t t = blockIdx.x;
  int seq;
  int64_t position;
  place_of(rows, t, seq, position);
  const int64_t visible = (position + 1) / rate;
  const float* row_scores = scores + t * max_visible;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    threshold = 0;
    remaining = static_cast<int>(visible < k ? visible : k);
  }
  __syncthreads();
  for (int bit = 31; bit >= 0 && remaining > 0; --bit) {
    const uint32_t high_mask = bit == 31 ? 0u : ~((1u << (bit + 1)) - 1u);
    const uint32_t candidate = threshold | (1u << bit);
    float count = 0.0f;
    for (int64_t w = threadIdx.x; w < visible; w += blockDim.x) {
      const uint32_t key = order_key(row_scores[w]);
      if ((key & (high_mask | (1u << bit))) == candidate) count += 1.0f;
    }
    const int above = static_cast<int>(block_sum(count, scratch));
    if (threadIdx.x == 0) {
      if (above >= remaining) {
        threshold = candidate;
      } else {
        remaining -= above;
      }
    }
    __syncthreads();
  }
  // Keys above the threshold are in; `remaining` ties at it go by index.
  if (warp == 0) {
    int written = 0, ties = 0;
    const int wanted = static_cast<int>(visible < k ? visible : k);
    for (int64_t base = 0; base < visible && written < wanted; base += 32) {
      const int64_t w = base + lane;
      const uint32_t key = w < visible ? order_key(row_scores[w]) : 0u;
      const bool tie = w < visible && key == threshold;
      const unsigned tie_mask = __ballot_sync(0xffffffffu, tie);
      const unsigned below = (1u << lane) - 1u;
      const bool take =
          w < visible && (key > threshold || (tie && ties + __popc(tie_mask & below) < remaining));
      const unsigned take_mask = __ballot_sync(0xffffffffu, take);
      if (take) selected[t * k + written + __popc(take_mask & below)] = static_cast<int32_t>(w);
      written += __popc(take_mask);
      ties += __popc(tie_mask);
    }
    for (int i = written + lane; i < k; i += 32) selected[t * k + i] = -1;
  }
}

// Head sizes the tiled kernel below does not take (not a multiple of 32, or above 512): one
// block per (row, head), logits over the window rows and entries (a warp per key), one
// softmax with the sink, then the weighted sum of the keys.
__global__ void sparse_attention_kernel(const float* q, int heads, int dim, DeviceRows rows,
                                        const int32_t* window_tables, int max_blocks,
                                        const float* window_keys, int block_size, int window,
                                        DeviceStripes entries, const int32_t* selected, int k,
                                        const float* sinks, float scale, float* out) {
  extern __shared__ float logits[];  // [window + entries]
  __shared__ float scratch[kWarps];
  const int64_t t = blockIdx.x / heads;
  const int h = blockIdx.x % heads;
  int seq;
  int64_t position;
  place_of(rows, t, seq, position);
  const int64_t first = window_first(rows, seq, position, window);
  const int window_count = static_cast<int>(position - first + 1);
  const int64_t visible = entries.rate > 0 ? (position + 1) / entries.rate : 0;
  const int entry_count = selected ? k : static_cast<int>(visible);
  const int total = window_count + entry_count;
  const float* query = q + (t * heads + h) * dim;
  const int32_t* table = window_tables + static_cast<int64_t>(seq) * max_blocks;
  // Key j: a window row (j < window_count) or an entry (-1 chosen slots are skipped).
  auto window_row = [&](int j) {
    const int64_t p = first + j;
    return window_keys +
           (static_cast<int64_t>(table[p / block_size]) * block_size + p % block_size) * dim;
  };
  auto entry_of = [&](int j) -> int64_t {
    return selected ? selected[t * k + (j - window_count)] : j - window_count;
  };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int j = warp; j < total; j += kWarps) {
    float d = 0.0f;
    if (j < window_count) {
      const float* key = window_row(j);
      for (int i = lane; i < dim; i += 32) d += query[i] * key[i];
    } else {
      const int64_t w = entry_of(j);
      for (int i = lane; w >= 0 && i < dim; i += 32) d += query[i] * *entry_at(entries, seq, w, i);
    }
    d = warp_sum(d);
    if (lane == 0) logits[j] = j >= window_count && entry_of(j) < 0 ? -FLT_MAX : d * scale;
  }
  __syncthreads();
  float top = sinks[h];
  for (int j = 0; j < total; ++j) top = fmaxf(top, logits[j]);
  float partial = 0.0f;
  for (int j = threadIdx.x; j < total; j += blockDim.x) partial += expf(logits[j] - top);
  const float sum = block_sum(partial, scratch) + expf(sinks[h] - top);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < total; ++j) {
      const float p = expf(logits[j] - top);
      if (j < window_count) {
        acc += p * window_row(j)[i];
      } else {
        const int64_t w = entry_of(j);
        if (w >= 0) acc += p * *entry_at(entries, seq, w, i);
      }
    }
    out[(t * heads + h) * dim + i] = acc / sum;
  }
}

constexpr int kKeysPerTile = 32;
constexpr int kHeadsPerBlock = kWarps;  // a warp per head
constexpr int kMaxTiledDim = 512;       // the accumulators a lane keeps: dim / 32

// Where a split of the keys leaves its unnormalised output and its softmax state, for
// sparse_attention_combine_kernel: per (row, head, split) dim floats, then (max, sum).
struct KeySplits {
  int count = 1;  // 1: no split, the kernel writes the output itself
  int keys_per_split = 0;
  float* partial = nullptr;
};

// The same attention with keys shared by kHeadsPerBlock heads (grid: rows x head groups x key
// splits): tiles of kKeysPerTile keys are gathered into shared memory once, and each warp runs
// one head's online softmax over them with its output in registers. Unsplit, the sink starts
// the softmax and the output is final; split, each split's state goes to `splits.partial`.
__global__ void __launch_bounds__(kThreads)
    sparse_attention_tiled_kernel(const float* q, int heads, int dim, DeviceRows rows,
                                  const int32_t* window_tables, int max_blocks,
                                  const float* window_keys, int block_size, int window,
                                  DeviceStripes entries, const int32_t* selected, int k,
                                  const float* sinks, float scale, KeySplits splits, float* out) {
  extern __shared__ float shared[];
  float* tile = shared;                          // [kKeysPerTile][dim]
  float* queries = shared + kKeysPerTile * dim;  // [kHeadsPerBlock][dim]
  __shared__ bool valid[kKeysPerTile];
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = blockIdx.y * kHeadsPerBlock + warp;
  int seq;
  int64_t position;
  place_of(rows, t, seq, position);
  const int64_t first = window_first(rows, seq, position, window);
  const int window_count = static_cast<int>(position - first + 1);
  const int64_t visible = entries.rate > 0 ? (position + 1) / entries.rate : 0;
  const int total = window_count + (selected ? k : static_cast<int>(visible));
  const int32_t* table = window_tables + static_cast<int64_t>(seq) * max_blocks;
  for (int i = threadIdx.x; i < kHeadsPerBlock * dim; i += blockDim.x) {
    const int head = blockIdx.y * kHeadsPerBlock + i / dim;
    queries[i] = head < heads ? q[(t * heads + head) * dim + i % dim] : 0.0f;
  }
  const int per_lane = dim / 32;
  float acc[kMaxTiledDim / 32];
  for (int r = 0; r < kMaxTiledDim / 32; ++r) acc[r] = 0.0f;
  const bool split = splits.count > 1;
  // Split: -FLT_MAX, not -inf, so that exp(top - next) stays 0 rather than NaN.
  float top = split ? -FLT_MAX : (h < heads ? sinks[h] : 0.0f);
  float sum = split ? 0.0f : 1.0f;  // unsplit, the sink: exp(sink - top) = 1
  const int begin = split ? static_cast<int>(blockIdx.z) * splits.keys_per_split : 0;
  const int end = split ? min(total, begin + splits.keys_per_split) : total;
  for (int base = begin; base < end; base += kKeysPerTile) {
    __syncthreads();
    for (int i = threadIdx.x; i < kKeysPerTile * dim; i += blockDim.x) {
      const int j = base + i / dim, c = i % dim;
      float value = 0.0f;
      bool present = j < end;
      if (present && j < window_count) {
        const int64_t p = first + j;
        value = window_keys
            [(static_cast<int64_t>(table[p / block_size]) * block_size + p % block_size) * dim + c];
      } else if (present) {
        const int64_t w = selected ? selected[t * k + (j - window_count)] : j - window_count;
        present = w >= 0;
        if (present) value = *entry_at(entries, seq, w, c);
      }
      tile[i] = value;
      if (c == 0) valid[i / dim] = present;
    }
    __syncthreads();
    if (h >= heads) continue;
    const float* query = queries + warp * dim;
    for (int j = 0; j < kKeysPerTile && base + j < end; ++j) {
      if (!valid[j]) continue;
      const float* key = tile + j * dim;
      float d = 0.0f;
      for (int r = 0; r < per_lane; ++r) d += query[lane + 32 * r] * key[lane + 32 * r];
      const float logit = warp_sum(d) * scale;
      const float next = fmaxf(top, logit);
      const float keep = expf(top - next), weight = expf(logit - next);
      sum = sum * keep + weight;
      for (int r = 0; r < per_lane; ++r) acc[r] = acc[r] * keep + weight * key[lane + 32 * r];
      top = next;
    }
  }
  if (h >= heads) return;
  if (!split) {
    for (int r = 0; r < per_lane; ++r) out[(t * heads + h) * dim + lane + 32 * r] = acc[r] / sum;
    return;
  }
  float* state = splits.partial + ((t * heads + h) * splits.count + blockIdx.z) * (dim + 2);
  for (int r = 0; r < per_lane; ++r) state[lane + 32 * r] = acc[r];
  if (lane == 0) {
    state[dim] = top;
    state[dim + 1] = sum;
  }
}

// One block per (row, head): the splits' states merged with the sink into the output.
__global__ void sparse_attention_combine_kernel(int heads, int dim, const float* sinks,
                                                KeySplits splits, float* out) {
  const int64_t row_head = blockIdx.x;
  const int h = static_cast<int>(row_head % heads);
  const float* states = splits.partial + row_head * splits.count * (dim + 2);
  float top = sinks[h];
  for (int s = 0; s < splits.count; ++s) {
    const float* state = states + s * (dim + 2);
    if (state[dim + 1] > 0.0f) top = fmaxf(top, state[dim]);
  }
  float sum = expf(sinks[h] - top);
  for (int s = 0; s < splits.count; ++s) {
    const float* state = states + s * (dim + 2);
    if (state[dim + 1] > 0.0f) sum += state[dim + 1] * expf(state[dim] - top);
  }
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < splits.count; ++s) {
      const float* state = states + s * (dim + 2);
      if (state[dim + 1] > 0.0f) acc += state[i] * expf(state[dim] - top);
    }
    out[row_head * dim + i] = acc / sum;
  }
}

// Key splits for a grid of few blocks (a decode of a few rows): enough splits of whole tiles
// to give the GPU about kSplitTargetBlocks blocks, none for grids already that large.
constexpr int64_t kSplitTargetBlocks = 256;

int64_t sparse_attention_split_count(int64_t tokens, int heads, int64_t max_keys) {
  const int64_t blocks = tokens * ((heads + kHeadsPerBlock - 1) / kHeadsPerBlock);
  if (blocks >= kSplitTargetBlocks / 2) return 1;
  const int64_t tiles = (std::max<int64_t>(max_keys, 1) + kKeysPerTile - 1) / kKeysPerTile;
  return std::clamp<int64_t>((kSplitTargetBlocks + blocks - 1) / blocks, 1, tiles);
}

KeySplits sparse_attention_splits(int64_t tokens, int heads, int64_t max_keys, float* workspace) {
  KeySplits splits;
  splits.count = static_cast<int>(sparse_attention_split_count(tokens, heads, max_keys));
  if (splits.count == 1) return splits;
  const int64_t tiles = (max_keys + kKeysPerTile - 1) / kKeysPerTile;
  splits.keys_per_split =
      static_cast<int>((tiles + splits.count - 1) / splits.count) * kKeysPerTile;
  splits.partial = workspace;
  return splits;
}

constexpr int kPointersPerLaunch = 256;  // 2 KiB of kernel parameters (4 KiB allowed)

struct AddressBatch {
  uintptr_t values[kPointersPerLaunch];
};

__global__ void store_addresses_kernel(AddressBatch batch, int count, uintptr_t* out) {
  for (int i = threadIdx.x; i < count; i += blockDim.x) out[i] = batch.values[i];
}

}  // namespace

void store_addresses(const uintptr_t* addresses, int64_t count, uintptr_t* out,
                     cudaStream_t stream) {
  for (int64_t first = 0; first < count; first += kPointersPerLaunch) {
    AddressBatch batch{};
    const int n = static_cast<int>(std::min<int64_t>(kPointersPerLaunch, count - first));
    for (int i = 0; i < n; ++i) batch.values[i] = addresses[first + i];
    store_addresses_kernel<<<1, kThreads, 0, stream>>>(batch, n, out + first);
    check_launch("store_addresses");
  }
}

int64_t hc_pre_scratch_floats(int64_t tokens, int64_t width, int streams_count, int mixes) {
  return tokens * (int64_t{hc_chunks(streams_count * width)} * (mixes + 1) + streams_count);
}

void hc_pre(const float* streams, int64_t tokens, int64_t width, const float* fn, const float* base,
            const float* scale, int streams_count, int mixes, int sinkhorn_iterations, float eps,
            float norm_eps, float* scratch, float* mix, float* collapsed, cudaStream_t stream) {
  if (mixes + 1 > kHcSharedFloats)
    fail("hc_pre: {} streams need {} mixing logits (at most {} on the GPU)", streams_count, mixes,
         kHcSharedFloats);
  if (tokens == 0) return;
  const int64_t flat = streams_count * width;
  const int chunks = hc_chunks(flat);
  float* partials = scratch;
  float* pre = scratch + tokens * chunks * (mixes + 1);
  const auto tiles = static_cast<unsigned>((tokens + kHcTokenTile - 1) / kHcTokenTile);
  hc_partials_kernel<<<dim3(static_cast<unsigned>(chunks), tiles), kThreads, 0, stream>>>(
      streams, tokens, flat, fn, mixes, partials);
  check_launch("hc_pre (partials)");
  hc_mix_kernel<<<static_cast<unsigned>(tokens), kThreads, (mixes + 1) * sizeof(float), stream>>>(
      partials, chunks, flat, base, scale, streams_count, mixes, sinkhorn_iterations, eps, norm_eps,
      pre, mix);
  check_launch("hc_pre (mix)");
  const dim3 grid(static_cast<unsigned>((width + kThreads - 1) / kThreads),
                  static_cast<unsigned>(tokens));
  hc_collapse_kernel<<<grid, kThreads, 0, stream>>>(streams, width, pre, streams_count, collapsed);
  check_launch("hc_pre (collapse)");
}

void hc_post(const float* out, const float* mix, int64_t tokens, int64_t width, int streams_count,
             float* streams, cudaStream_t stream) {
  // Threads a block: as many as the shared memory holds the old streams of, a warp at least.
  const int threads = std::min<int>(kThreads, kHcSharedFloats / streams_count / 32 * 32);
  if (threads < 32)
    fail("hc_post: {} streams (at most {} on the GPU)", streams_count, kHcSharedFloats / 32);
  if (tokens == 0) return;
  const dim3 grid(static_cast<unsigned>((width + threads - 1) / threads),
                  static_cast<unsigned>(tokens));
  hc_post_kernel<<<grid, threads, threads * streams_count * sizeof(float), stream>>>(
      out, mix, width, streams_count, streams);
  check_launch("hc_post");
}

void write_records(const float* values, int64_t tokens, int64_t width, DeviceRows rows,
                   DeviceRecords records, cudaStream_t stream) {
  if (tokens == 0) return;
  write_records_kernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream>>>(values, width, rows,
                                                                               records);
  check_launch("write_records");
}

void compress_windows(DeviceRecords inputs, const Compressor& compressor,
                      const float* position_bias, const float* norm, const int32_t* windows,
                      int64_t count, const float* cos, const float* sin, DeviceStripes entries,
                      cudaStream_t stream) {
  if (count == 0) return;
  compress_kernel<<<static_cast<unsigned>(count), kThreads, compressor.width * sizeof(float),
                    stream>>>(inputs, compressor, position_bias, norm, windows, cos, sin, entries);
  check_launch("compress_windows");
}

void index_select(const float* queries, const float* head_weights, int64_t tokens, int heads,
                  int dim, float scale, DeviceRows rows, DeviceStripes entries, int64_t key_offset,
                  int k, int64_t max_visible, bool tensor_cores, float* scores, int32_t* selected,
                  cudaStream_t stream) {
  if (tokens == 0) return;
  const int64_t visible = max_visible > 0 ? max_visible : 1;
  if (tensor_cores && index_scores_on_tensor_cores(tokens, heads, dim)) {
    index_scores_mma(queries, head_weights, tokens, heads, dim, scale, rows, entries, key_offset,
                     visible, scores, stream);
  } else {
    index_scores(queries, head_weights, tokens, heads, dim, scale, rows, entries, key_offset,
                 visible, scores, stream);
  }
  index_topk_kernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream>>>(
      rows, entries.rate, k, visible, scores, selected);
  check_launch("index_select");
}

void index_scores(const float* queries, const float* head_weights, int64_t tokens, int heads,
                  int dim, float scale, DeviceRows rows, DeviceStripes entries, int64_t key_offset,
                  int64_t visible, float* scores, cudaStream_t stream) {
  const int64_t chunks = (visible + kEntriesPerScoreBlock - 1) / kEntriesPerScoreBlock;
  const size_t shared = (static_cast<size_t>(heads) * (dim + 1) + kWarps * dim) * sizeof(float);
  if (chunks > 65535 || shared > 200 * 1024)
    fail("index_select: {} entries of {} heads x {} (at most {} entries, 200 KiB of queries)",
         visible, heads, dim, 65535 * kEntriesPerScoreBlock);
  if (shared > 48 * 1024) {
    cudaFuncSetAttribute(index_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(shared));
  }
  index_scores_kernel<<<dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(chunks)),
                        kThreads, shared, stream>>>(queries, head_weights, heads, dim, scale, rows,
                                                    entries, key_offset, visible, scores);
  check_launch("index_select (scores)");
}

int64_t sparse_attention_workspace_floats(int64_t tokens, int heads, int dim, int64_t max_keys) {
  if (dim % 32 != 0 || dim > kMaxTiledDim) return 0;
  const int64_t count = sparse_attention_split_count(tokens, heads, max_keys);
  return count > 1 ? tokens * heads * count * (dim + 2) : 0;
}

void sparse_attention(const float* q, int64_t tokens, int heads, int dim, DeviceRows rows,
                      const int32_t* window_tables, int max_blocks_per_seq,
                      const float* window_keys, int block_size, int window, DeviceStripes entries,
                      const int32_t* selected, int k, int64_t max_keys, const float* sinks,
                      float scale, bool tensor_cores, float* out, float* workspace,
                      cudaStream_t stream) {
  if (tokens == 0) return;
  if (tensor_cores && sparse_attention_on_tensor_cores(tokens, heads, dim)) {
    sparse_attention_mma(q, tokens, heads, dim, rows, window_tables, max_blocks_per_seq,
                         window_keys, block_size, window, entries, selected, k, sinks, scale, out,
                         stream);
    return;
  }
  const int64_t groups = (heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  if (dim % 32 == 0 && dim <= kMaxTiledDim) {
    const KeySplits splits = sparse_attention_splits(tokens, heads, max_keys, workspace);
    const size_t shared = static_cast<size_t>(kKeysPerTile + kHeadsPerBlock) * dim * sizeof(float);
    if (shared > 48 * 1024) {
      cudaFuncSetAttribute(sparse_attention_tiled_kernel,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    }
    const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(groups),
                    static_cast<unsigned>(splits.count));
    sparse_attention_tiled_kernel<<<grid, kThreads, shared, stream>>>(
        q, heads, dim, rows, window_tables, max_blocks_per_seq, window_keys, block_size, window,
        entries, selected, k, sinks, scale, splits, out);
    check_launch("sparse_attention");
    if (splits.count > 1) {
      sparse_attention_combine_kernel<<<static_cast<unsigned>(tokens * heads), kThreads, 0,
                                        stream>>>(heads, dim, sinks, splits, out);
      check_launch("sparse_attention (combine)");
    }
    return;
  }
  // Other head sizes: a block per (row, head), the logits of every key in shared memory.
  const size_t shared = static_cast<size_t>(max_keys) * sizeof(float);
  constexpr size_t kMaxShared = 200 * 1024;
  if (shared > kMaxShared)
    fail("sparse_attention: {} keys per query (at most {})", max_keys, kMaxShared / 4);
  if (shared > 48 * 1024) {
    cudaFuncSetAttribute(sparse_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(shared));
  }
  sparse_attention_kernel<<<static_cast<unsigned>(tokens * heads), kThreads, shared, stream>>>(
      q, heads, dim, rows, window_tables, max_blocks_per_seq, window_keys, block_size, window,
      entries, selected, k, sinks, scale, out);
  check_launch("sparse_attention");
}

}  // namespace deepinfer::cuda

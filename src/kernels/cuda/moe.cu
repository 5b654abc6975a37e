// Mixture-of-experts layers of decode batches without leaving the device: the router's
// choice, the (token, expert) pairs grouped by expert, every chosen expert's gated MLP over
// its pairs (each weight row read once per group of up to eight pairs), and the weighted sum
// per token. No host round trip, so a step stays one stream of kernels.
#include <algorithm>
#include <cfloat>

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/weight_chunks.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kRouteThreads = 256;
constexpr int kGroupThreads = 1024;
constexpr int kRowsPerItem = 8;
constexpr int kWarpsPerBlock = 8;
constexpr int kColumnsPerWarp = 4;

struct Best {
  float value;
  int index;
};

// The larger value; of equal values the lower index (the CPU's top_indices order).
__device__ Best better(Best a, Best b) {
  return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}

__device__ Best warp_best(Best best) {
  for (int offset = 16; offset > 0; offset /= 2) {
    Best other{__shfl_xor_sync(0xffffffffu, best.value, offset),
               __shfl_xor_sync(0xffffffffu, best.index, offset)};
    best = better(best, other);
  }
  return best;
}

// The block's best (value, index); every thread gets it.
__device__ Best block_best(Best best) {
  __shared__ Best per_warp[kRouteThreads / 32];
  best = warp_best(best);
  if (threadIdx.x % 32 == 0) per_warp[threadIdx.x / 32] = best;
  __syncthreads();
  Best total = per_warp[0];
  for (int w = 1; w < kRouteThreads / 32; ++w) total = better(total, per_warp[w]);
  __syncthreads();
  return total;
}

__device__ float block_sum(float value) {
  __shared__ float per_warp[kRouteThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  if (threadIdx.x % 32 == 0) per_warp[threadIdx.x / 32] = value;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kRouteThreads / 32; ++w) total += per_warp[w];
  __syncthreads();
  return total;
}

// scores = softmax or sigmoid of the row's logits.
__device__ void score_experts(const float* logits, const ExpertRouting& routing, float* scores) {
  const int experts = routing.num_experts;
  if (routing.scoring == ExpertRouting::Scoring::kSigmoid) {
    for (int e = threadIdx.x; e < experts; e += blockDim.x)
      scores[e] = 1.0f / (1.0f + expf(-logits[e]));
    __syncthreads();
    return;
  }
  if (routing.scoring == ExpertRouting::Scoring::kSqrtSoftplus) {
    for (int e = threadIdx.x; e < experts; e += blockDim.x)
      scores[e] = sqrtf(logits[e] > 20.0f ? logits[e] : log1pf(expf(logits[e])));
    __syncthreads();
    return;
  }
  Best top{-FLT_MAX, 0};
  for (int e = threadIdx.x; e < experts; e += blockDim.x) top = better(top, {logits[e], e});
  const float max_logit = block_best(top).value;
  float partial = 0.0f;
  for (int e = threadIdx.x; e < experts; e += blockDim.x)
    partial += scores[e] = expf(logits[e] - max_logit);
  const float total = block_sum(partial);
  for (int e = threadIdx.x; e < experts; e += blockDim.x) scores[e] /= total;
  __syncthreads();
}

// Zeroes the candidates outside the topk_groups best groups (one thread per group ranks it).
__device__ void keep_best_groups(const ExpertRouting& routing, float* candidates) {
  __shared__ float group_score[kMaxRoutedExperts];
  __shared__ bool keep[kMaxRoutedExperts];
  const int per_group = routing.num_experts / routing.num_groups;
  for (int g = threadIdx.x; g < routing.num_groups; g += blockDim.x) {
    const float* members = candidates + g * per_group;
    Best first{-FLT_MAX, 0}, second{-FLT_MAX, 0};
    for (int i = 0; i < per_group; ++i) first = better(first, {members[i], i});
    for (int i = 0; i < per_group; ++i)
      if (i != first.index) second = better(second, {members[i], i});
    group_score[g] = routing.group_ranking == ExpertRouting::GroupRanking::kTopTwoSum
                         ? first.value + second.value
                         : first.value;
    keep[g] = false;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int round = 0; round < routing.topk_groups; ++round) {
      Best best{-FLT_MAX, routing.num_groups};
      for (int g = 0; g < routing.num_groups; ++g)
        if (!keep[g]) best = better(best, {group_score[g], g});
      if (best.index < routing.num_groups) keep[best.index] = true;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < routing.num_experts; e += blockDim.x)
    if (!keep[e / per_group]) candidates[e] = 0.0f;
  __syncthreads();
}

// Block per token: route_token's choice (experts largest biased score first) and weights.
__global__ void __launch_bounds__(kRouteThreads)
    route_kernel(const float* logits, const float* correction_bias, FixedExperts fixed,
                 ExpertRouting routing, int32_t* experts, float* weights) {
  __shared__ float scores[kMaxRoutedExperts];
  __shared__ float candidates[kMaxRoutedExperts];
  __shared__ bool taken[kMaxRoutedExperts];
  __shared__ int chosen[kMaxExpertsPerToken];
  const int64_t token = blockIdx.x;
  score_experts(logits + token * routing.num_experts, routing, scores);
  for (int e = threadIdx.x; e < routing.num_experts; e += blockDim.x) {
    candidates[e] = scores[e] + (correction_bias ? correction_bias[e] : 0.0f);
    taken[e] = false;
  }
  __syncthreads();
  const bool hashed = fixed.table != nullptr;
  if (hashed) {  // hash routing: the token's experts are given
    if (threadIdx.x == 0) {
      const int64_t row = fixed.token_ids ? fixed.token_ids[token] : token;
      for (int i = 0; i < routing.experts_per_token; ++i)
        chosen[i] = fixed.table[row * routing.experts_per_token + i];
    }
    __syncthreads();
  } else if (routing.group_ranking != ExpertRouting::GroupRanking::kNone &&
             routing.num_groups > 1) {
    keep_best_groups(routing, candidates);
  }
  for (int round = 0; !hashed && round < routing.experts_per_token; ++round) {
    Best best{-FLT_MAX, routing.num_experts};
    for (int e = threadIdx.x; e < routing.num_experts; e += blockDim.x)
      if (!taken[e]) best = better(best, {candidates[e], e});
    best = block_best(best);
    if (threadIdx.x == 0) {
      chosen[round] = best.index;
      taken[best.index] = true;
    }
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  const int k = routing.experts_per_token;
  float total = 0.0f;
  for (int i = 0; i < k; ++i) total += scores[chosen[i]];
  float factor = routing.scaling;
  if (routing.normalize) factor /= total + 1e-20f;
  for (int i = 0; i < k; ++i) {
    experts[token * k + i] = chosen[i];
    weights[token * k + i] = scores[chosen[i]] * factor;
  }
}

// The work items of the expert products: each a run of at most kRowsPerItem pairs of one
// expert in `order` (pairs sorted by expert, in pair order within an expert).
struct Items {
  int32_t* order;   // [pairs]
  int32_t* expert;  // [max items]
  int32_t* start;   // into order
  int32_t* rows;
  int32_t* count;  // [1]
};

__global__ void __launch_bounds__(kGroupThreads)
    group_by_expert_kernel(const int32_t* experts, int pairs, int num_experts, Items items) {
  __shared__ int32_t chosen[kMaxRoutedPairs];
  __shared__ int32_t counts[kMaxRoutedExperts];
  __shared__ int32_t starts[kMaxRoutedExperts];
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    chosen[p] = experts[p];
    atomicAdd(&counts[chosen[p]], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0, count = 0;
    for (int e = 0; e < num_experts; ++e) {
      starts[e] = run;
      for (int done = 0; done < counts[e]; done += kRowsPerItem, ++count) {
        items.expert[count] = e;
        items.start[count] = run + done;
        items.rows[count] = min(kRowsPerItem, counts[e] - done);
      }
      run += counts[e];
    }
    *items.count = count;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    int at = starts[e];
    for (int p = 0; p < pairs && at < starts[e] + counts[e]; ++p)
      if (chosen[p] == e) items.order[at++] = p;
  }
}

template <typename Chunks>
__device__ Chunks format_of(const float* scales, int64_t scale_cols);
template <>
__device__ Bf16Chunks format_of<Bf16Chunks>(const float*, int64_t) {
  return {};
}
template <>
__device__ Fp8Chunks format_of<Fp8Chunks>(const float* scales, int64_t scale_cols) {
  return {scales, scale_cols};
}

// One or two per-expert products of the same rows, their output columns end to end.
struct ExpertProducts {
  ExpertMatrix matrix[2];
  int count;
};

// Warp per (kColumnsPerWarp output columns, item): those weight rows against the item's
// pairs' x rows (x row of pair p: p / pairs_per_x_row), into row p of `out` [pairs, columns].
// Each lane takes 16-byte chunks of the rows and works through them 8 elements at a time, so
// every 8 floats of x it loads serve all its columns (x is re-read per column otherwise, and
// that traffic, not the weights, bounded the kernel). A group of columns never straddles the
// two products or a 128-column scale block: their widths are multiples of the chunk.
template <typename Chunks>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    expert_rows_kernel(const float* __restrict__ x, int64_t k, int pairs_per_x_row, Items items,
                       ExpertProducts products, float* out) {
  constexpr int kPer = Chunks::kPerChunk, kParts = kPer / 8;
  const int item = blockIdx.y;
  if (item >= *items.count) return;
  const int64_t columns = products.matrix[0].n + (products.count > 1 ? products.matrix[1].n : 0);
  const int64_t first_column =
      (blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32) * kColumnsPerWarp;
  if (first_column >= columns) return;
  const bool second = first_column >= products.matrix[0].n;
  // A copy chosen by value: indexing the parameter array at run time would copy it to the stack.
  const ExpertMatrix matrix = second ? products.matrix[1] : products.matrix[0];
  const int64_t column = first_column - (second ? products.matrix[0].n : 0);
  const int expert = items.expert[item];
  const Chunks format =
      format_of<Chunks>(matrix.scales ? matrix.scales[expert] : nullptr, matrix.scale_cols);
  const int64_t chunks = k / kPer;
  const uint4* weight_rows = static_cast<const uint4*>(matrix.weights[expert]) + column * chunks;
  const int rows = items.rows[item];
  const int32_t* pair = items.order + items.start[item];
  float acc[kRowsPerItem][kColumnsPerWarp] = {};
  const int lane = threadIdx.x % 32;
  for (int64_t chunk = lane; chunk < chunks; chunk += 32) {
    uint4 packed[kColumnsPerWarp];
#pragma unroll
    for (int c = 0; c < kColumnsPerWarp; ++c) packed[c] = __ldg(weight_rows + c * chunks + chunk);
    const float scale = format.scale(column, chunk);
#pragma unroll
    for (int part = 0; part < kParts; ++part) {
      float w[kColumnsPerWarp][8];
#pragma unroll
      for (int c = 0; c < kColumnsPerWarp; ++c) format.widen_part(packed[c], part, w[c]);
#pragma unroll
      for (int r = 0; r < kRowsPerItem; ++r) {
        if (r >= rows) break;
        const auto* at = reinterpret_cast<const float4*>(x + (pair[r] / pairs_per_x_row) * k +
                                                         chunk * kPer + part * 8);
        const float4 low = at[0], high = at[1];
#pragma unroll
        for (int c = 0; c < kColumnsPerWarp; ++c) {
          const float dot = w[c][0] * low.x + w[c][1] * low.y + w[c][2] * low.z + w[c][3] * low.w +
                            w[c][4] * high.x + w[c][5] * high.y + w[c][6] * high.z +
                            w[c][7] * high.w;
          acc[r][c] += dot * scale;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerItem; ++r) {
    if (r >= rows) break;
#pragma unroll
    for (int c = 0; c < kColumnsPerWarp; ++c) {
      float sum = acc[r][c];
      for (int offset = 16; offset > 0; offset /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      if (lane == 0) out[pair[r] * columns + first_column + c] = sum;
    }
  }
}

// act[p, i] = silu(gate_up[p, i]) * gate_up[p, inter + i].
// act = silu(gate) * up per pair; a positive limit clamps gate from above, up both sides.
__global__ void gated_activation_kernel(const float* gate_up, int64_t pairs, int64_t inter,
                                        float limit, float* act) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < pairs * inter;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t p = i / inter, j = i % inter;
    float g = gate_up[p * 2 * inter + j];
    float u = gate_up[p * 2 * inter + inter + j];
    if (limit > 0.0f) {
      g = fminf(g, limit);
      u = fminf(fmaxf(u, -limit), limit);
    }
    act[i] = g / (1.0f + expf(-g)) * u;
  }
}

// out[t, :] += sum over the token's pairs s of weights[s] * expert_out[s, :], in pair order.
__global__ void combine_kernel(const float* expert_out, const float* weights, int per_token,
                               int64_t hidden, float* out) {
  const int64_t token = blockIdx.x;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    float sum = 0.0f;
    for (int s = 0; s < per_token; ++s) {
      const int64_t pair = token * per_token + s;
      sum += weights[pair] * expert_out[pair * hidden + j];
    }
    out[token * hidden + j] += sum;
  }
}

// FP8 experts on the tensor cores: x and the activations quantised to e4m3 with a scale per
// row and 128-wide block of k (as the prompt path quantises them), so each product is an e4m3
// mma whose 128-deep partial sums take the weight block's scale times the row's.
constexpr float kE4m3Largest = 448.0f;
constexpr int kQuantiseWarps = 8;
constexpr int kMmaWarps = 4;
constexpr int kMmaColumns = 16;  // output columns a warp's mma covers; its 8 pairs are the rest

// Rows of e4m3 values [rows, k] with a scale per row and 128-wide block [rows, k / 128].
struct Fp8Rows {
  uint8_t* values;
  float* scales;
  int64_t k;
};

// One 128-wide block held four values a lane (lane l: 4l..4l+3), quantised by its largest
// magnitude: values / scale in e4m3 at `values`, scale = largest / 448 (0 for a zero block).
__device__ void quantise_block(float4 v, uint8_t* values, float* scale) {
  float largest = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
  for (int offset = 16; offset > 0; offset /= 2)
    largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
  const float inverse = largest > 0.0f ? kE4m3Largest / largest : 0.0f;
  const auto low = __nv_cvt_float2_to_fp8x2(make_float2(v.x * inverse, v.y * inverse),
                                            __NV_SATFINITE, __NV_E4M3);
  const auto high = __nv_cvt_float2_to_fp8x2(make_float2(v.z * inverse, v.w * inverse),
                                             __NV_SATFINITE, __NV_E4M3);
  const int lane = threadIdx.x % 32;
  reinterpret_cast<uint32_t*>(values)[lane] = uint32_t{low} | uint32_t{high} << 16;
  if (lane == 0) *scale = largest / kE4m3Largest;
}

// Warp per (row, block) of x [rows, k].
__global__ void __launch_bounds__(kQuantiseWarps * 32)
    quantise_rows_kernel(const float* x, int64_t rows, Fp8Rows q) {
  const int64_t blocks = q.k / kScaleBlock;
  const int64_t at = blockIdx.x * int64_t{kQuantiseWarps} + threadIdx.x / 32;
  if (at >= rows * blocks) return;
  const int64_t row = at / blocks, block = at % blocks, lane = threadIdx.x % 32;
  const float4 v = reinterpret_cast<const float4*>(x + row * q.k + block * kScaleBlock)[lane];
  quantise_block(v, q.values + row * q.k + block * kScaleBlock, q.scales + at);
}

// gated_activation_kernel's act, quantised: warp per (pair, block) of act [pairs, inter].
__global__ void __launch_bounds__(kQuantiseWarps * 32)
    gated_activation_fp8_kernel(const float* gate_up, int64_t pairs, float limit, Fp8Rows q) {
  const int64_t inter = q.k, blocks = inter / kScaleBlock;
  const int64_t at = blockIdx.x * int64_t{kQuantiseWarps} + threadIdx.x / 32;
  if (at >= pairs * blocks) return;
  const int64_t pair = at / blocks, block = at % blocks, lane = threadIdx.x % 32;
  const float* gate = gate_up + pair * 2 * inter + block * kScaleBlock + lane * 4;
  float g[4], u[4], act[4];
  *reinterpret_cast<float4*>(g) = *reinterpret_cast<const float4*>(gate);
  *reinterpret_cast<float4*>(u) = *reinterpret_cast<const float4*>(gate + inter);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (limit > 0.0f) {
      g[i] = fminf(g[i], limit);
      u[i] = fminf(fmaxf(u[i], -limit), limit);
    }
    act[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
  }
  quantise_block(make_float4(act[0], act[1], act[2], act[3]),
                 q.values + pair * inter + block * kScaleBlock, q.scales + at);
}

// One 128-deep block of a warp's operands, loaded a block ahead of its products so that a
// warp's weight loads stay in flight while it multiplies (loaded, then used, they left each
// warp waiting on the memory's latency once a block). Per 16-column group: weight rows g and
// g + 8, each as two 16-byte loads (the block's two 64-deep halves); per 8-pair tile: pair g's
// x row likewise.
template <int kGroups, int kTiles>
struct MmaStage {
  uint4 w[kGroups][2][2];  // [group][row g, g + 8][half]
  uint4 x[kTiles][2];
  float w_scale;  // the groups share a 128-column scale block
  float x_scale[kTiles][2];
};

template <int kGroups, int kTiles>
struct MmaOperands {
  const uint4* w[kGroups][2];
  const uint4* x[kTiles];
  const float* w_scales;
  const float* x_scales[kTiles][2];
};

template <int kGroups, int kTiles>
__device__ void load_stage(MmaStage<kGroups, kTiles>& s, const MmaOperands<kGroups, kTiles>& o,
                           int64_t block) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t at = (block * 2 + h) * 4;  // 16-byte loads: 64 k are 4 of them
#pragma unroll
    for (int c = 0; c < kGroups; ++c) {
      s.w[c][0][h] = __ldg(o.w[c][0] + at);
      s.w[c][1][h] = __ldg(o.w[c][1] + at);
    }
#pragma unroll
    for (int n = 0; n < kTiles; ++n) s.x[n][h] = __ldg(o.x[n] + at);
  }
  s.w_scale = __ldg(o.w_scales + block);
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
    s.x_scale[n][0] = __ldg(o.x_scales[n][0] + block);
    s.x_scale[n][1] = __ldg(o.x_scales[n][1] + block);
  }
}

// acc[c][n] += one block's products of group c and tile n, scaled by the weight block's scale
// and each pair's.
template <int kGroups, int kTiles>
__device__ void multiply_stage(float (&acc)[kGroups][kTiles][4],
                               const MmaStage<kGroups, kTiles>& s) {
#pragma unroll
  for (int c = 0; c < kGroups; ++c) {
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
      float partial[4] = {};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 low = s.w[c][0][h], high = s.w[c][1][h], in = s.x[n][h];
        mma_e4m3(partial, low.x, high.x, low.y, high.y, in.x, in.y);
        mma_e4m3(partial, low.z, high.z, low.w, high.w, in.z, in.w);
      }
      const float s0 = s.w_scale * s.x_scale[n][0], s1 = s.w_scale * s.x_scale[n][1];
      acc[c][n][0] += partial[0] * s0;
      acc[c][n][1] += partial[1] * s1;
      acc[c][n][2] += partial[2] * s0;
      acc[c][n][3] += partial[3] * s1;
    }
  }
}

// acc[c][n]: columns 16c + g and 16c + g + 8 of `out`'s rows, pairs 8n + 2t and 8n + 2t + 1.
template <int kGroups, int kTiles>
__device__ void store_mma(const float (&acc)[kGroups][kTiles][4], const int32_t* pair, int rows,
                          int64_t columns, float* out) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int r = 8 * n + 2 * t + j;
      if (r >= rows) continue;
      float* row = out + int64_t{pair[r]} * columns;
#pragma unroll
      for (int c = 0; c < kGroups; ++c) {
        row[c * kMmaColumns + g] = acc[c][n][j];
        row[c * kMmaColumns + g + 8] = acc[c][n][2 + j];
      }
    }
  }
}

// Warp per (kGroups x 16 output columns, item of up to kTiles x 8 pairs): those FP8 weight rows
// against the item's pairs' quantised x rows (x row of pair p: p / pairs_per_x_row), into row p
// of `out` [pairs, columns]. k is taken 64 at a time, a lane loading 16 consecutive bytes of
// weight rows g and g + 8 and of pair g's x row at 16t: two mma over the same permutation of
// those 64 k (bytes 0-7 of each lane's load feed the first, 8-15 the second), which the sum
// does not see. Each 128-deep partial takes the weight block's scale and its pair's; each
// block's loads are issued before the previous block's products (a 6% shorter V4 batch-64
// step on an H100 than loading and then multiplying each block).
template <int kGroups, int kTiles, int kMinBlocks>
__global__ void __launch_bounds__(kMmaWarps * 32, kMinBlocks)
    expert_mma_kernel(Fp8Rows x, int pairs_per_x_row, Items items, ExpertProducts products,
                      float* out) {
  const int item = blockIdx.y;
  if (item >= *items.count) return;
  const int64_t columns = products.matrix[0].n + (products.count > 1 ? products.matrix[1].n : 0);
  const int64_t first_column =
      (blockIdx.x * int64_t{kMmaWarps} + threadIdx.x / 32) * kMmaColumns * kGroups;
  if (first_column >= columns) return;
  const bool second = first_column >= products.matrix[0].n;
  const ExpertMatrix matrix = second ? products.matrix[1] : products.matrix[0];
  const int64_t column = first_column - (second ? products.matrix[0].n : 0);
  const int expert = items.expert[item];
  const int64_t k = x.k, blocks = k / kScaleBlock;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rows = items.rows[item];
  const int32_t* pair = items.order + items.start[item];
  // Columns past the item's rows compute on its first pair's x and are not stored.
  auto x_row = [&](int r) { return int64_t{pair[r < rows ? r : 0]} / pairs_per_x_row; };
  const auto* weights = static_cast<const uint8_t*>(matrix.weights[expert]);
  MmaOperands<kGroups, kTiles> o;
#pragma unroll
  for (int c = 0; c < kGroups; ++c) {
    const int64_t row = column + c * kMmaColumns + g;
    o.w[c][0] = reinterpret_cast<const uint4*>(weights + row * k) + t;
    o.w[c][1] = reinterpret_cast<const uint4*>(weights + (row + 8) * k) + t;
  }
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
    o.x[n] = reinterpret_cast<const uint4*>(x.values + x_row(8 * n + g) * k) + t;
    o.x_scales[n][0] = x.scales + x_row(8 * n + 2 * t) * blocks;
    o.x_scales[n][1] = x.scales + x_row(8 * n + 2 * t + 1) * blocks;
  }
  o.w_scales = matrix.scales[expert] + (column / kScaleBlock) * matrix.scale_cols;
  float acc[kGroups][kTiles][4] = {};
  MmaStage<kGroups, kTiles> next;
  load_stage(next, o, 0);
#pragma unroll 2
  for (int64_t block = 0; block < blocks; ++block) {
    const MmaStage<kGroups, kTiles> now = next;
    // The last block loads itself again (cached) rather than branch.
    load_stage(next, o, block + 1 < blocks ? block + 1 : block);
    multiply_stage(acc, now);
  }
  store_mma(acc, pair, rows, columns, out + first_column);
}

size_t round_up(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

// Where each piece of the workspace starts.
struct Workspace {
  int32_t* experts;
  float* weights;
  Items items;
  float* gate_up;
  float* act;
  float* expert_out;
  Fp8Rows x_fp8, act_fp8;  // the tensor-core path's inputs
};

size_t fp8_rows_bytes(int64_t rows, int64_t k) {
  const auto count = static_cast<size_t>(rows);
  return round_up(count * static_cast<size_t>(k)) +
         round_up(count * static_cast<size_t>((k + kScaleBlock - 1) / kScaleBlock) * 4);
}

Workspace carve(void* base, int64_t tokens, int64_t pairs, int64_t max_items, int64_t hidden,
                int64_t inter) {
  auto* at = static_cast<char*>(base);
  auto take = [&](size_t bytes) {
    char* piece = at;
    at += round_up(bytes);
    return piece;
  };
  const auto count = static_cast<size_t>(pairs);
  const auto item_count = static_cast<size_t>(max_items);
  Workspace w{};
  w.experts = reinterpret_cast<int32_t*>(take(count * 4));
  w.weights = reinterpret_cast<float*>(take(count * 4));
  w.items.order = reinterpret_cast<int32_t*>(take(count * 4));
  w.items.expert = reinterpret_cast<int32_t*>(take(item_count * 4));
  w.items.start = reinterpret_cast<int32_t*>(take(item_count * 4));
  w.items.rows = reinterpret_cast<int32_t*>(take(item_count * 4));
  w.items.count = reinterpret_cast<int32_t*>(take(4));
  w.gate_up = reinterpret_cast<float*>(take(count * static_cast<size_t>(2 * inter) * 4));
  w.act = reinterpret_cast<float*>(take(count * static_cast<size_t>(inter) * 4));
  w.expert_out = reinterpret_cast<float*>(take(count * static_cast<size_t>(hidden) * 4));
  auto fp8_rows = [&](int64_t rows, int64_t k) {
    const auto n = static_cast<size_t>(rows);
    Fp8Rows q{};
    q.values = reinterpret_cast<uint8_t*>(take(n * static_cast<size_t>(k)));
    q.scales = reinterpret_cast<float*>(
        take(n * static_cast<size_t>((k + kScaleBlock - 1) / kScaleBlock) * 4));
    q.k = k;
    return q;
  };
  w.x_fp8 = fp8_rows(tokens, hidden);
  w.act_fp8 = fp8_rows(pairs, inter);
  return w;
}

int64_t max_items(int64_t pairs, int num_experts) {
  return (pairs + kRowsPerItem - 1) / kRowsPerItem + std::min<int64_t>(pairs, num_experts);
}

template <typename Chunks>
void launch_products(const float* x, int64_t k, int pairs_per_x_row, const Items& items,
                     const ExpertProducts& products, unsigned grid_items, float* out,
                     cudaStream_t stream) {
  const int64_t columns = products.matrix[0].n + (products.count > 1 ? products.matrix[1].n : 0);
  constexpr int64_t kColumnsPerBlock = kWarpsPerBlock * kColumnsPerWarp;
  dim3 grid(static_cast<unsigned>((columns + kColumnsPerBlock - 1) / kColumnsPerBlock), grid_items);
  expert_rows_kernel<Chunks>
      <<<grid, kWarpsPerBlock * 32, 0, stream>>>(x, k, pairs_per_x_row, items, products, out);
}

// Gate and up, the gated activation, down: each product on the CUDA cores in weight chunks,
// in f32.
template <typename Chunks>
void run_chunk_products(const float* x, int64_t tokens, const ExpertRouting& routing,
                        const ExpertWeights& weights, const Workspace& w, cudaStream_t stream) {
  const int per_token = routing.experts_per_token;
  const int64_t pairs = tokens * per_token, inter = weights.inter, hidden = weights.down.n;
  const auto grid_items = static_cast<unsigned>(max_items(pairs, routing.num_experts));
  launch_products<Chunks>(x, hidden, per_token, w.items, {{weights.gate, weights.up}, 2},
                          grid_items, w.gate_up, stream);
  check_launch("routed_experts (gate/up)");
  const auto act_blocks =
      static_cast<unsigned>(std::min<int64_t>((pairs * inter + 255) / 256, 4096));
  gated_activation_kernel<<<act_blocks, 256, 0, stream>>>(w.gate_up, pairs, inter,
                                                          routing.swiglu_limit, w.act);
  launch_products<Chunks>(w.act, inter, 1, w.items, {{weights.down, weights.down}, 1}, grid_items,
                          w.expert_out, stream);
  check_launch("routed_experts (down)");
}

unsigned quantise_grid(int64_t rows, int64_t k) {
  return static_cast<unsigned>((rows * (k / kScaleBlock) + kQuantiseWarps - 1) / kQuantiseWarps);
}

void launch_mma(const Fp8Rows& x, int pairs_per_x_row, const Items& items,
                const ExpertProducts& products, unsigned grid_items, float* out,
                cudaStream_t stream) {
  const int64_t columns = products.matrix[0].n + (products.count > 1 ? products.matrix[1].n : 0);
  constexpr int64_t kColumnsPerBlock = kMmaWarps * kMmaColumns;
  dim3 grid(static_cast<unsigned>((columns + kColumnsPerBlock - 1) / kColumnsPerBlock), grid_items);
  expert_mma_kernel<1, 1, 1>
      <<<grid, kMmaWarps * 32, 0, stream>>>(x, pairs_per_x_row, items, products, out);
}

// The same products on the tensor cores (FP8 experts, widths in whole scale blocks): x
// quantised once, the activation quantised as it is formed.
void run_tensor_core_products(const float* x, int64_t tokens, const ExpertRouting& routing,
                              const ExpertWeights& weights, const Workspace& w,
                              cudaStream_t stream) {
  const int per_token = routing.experts_per_token;
  const int64_t pairs = tokens * per_token, inter = weights.inter;
  const auto grid_items = static_cast<unsigned>(max_items(pairs, routing.num_experts));
  quantise_rows_kernel<<<quantise_grid(tokens, w.x_fp8.k), kQuantiseWarps * 32, 0, stream>>>(
      x, tokens, w.x_fp8);
  launch_mma(w.x_fp8, per_token, w.items, {{weights.gate, weights.up}, 2}, grid_items, w.gate_up,
             stream);
  check_launch("routed_experts (gate/up on tensor cores)");
  gated_activation_fp8_kernel<<<quantise_grid(pairs, inter), kQuantiseWarps * 32, 0, stream>>>(
      w.gate_up, pairs, routing.swiglu_limit, w.act_fp8);
  launch_mma(w.act_fp8, 1, w.items, {{weights.down, weights.down}, 1}, grid_items, w.expert_out,
             stream);
  check_launch("routed_experts (down on tensor cores)");
}

}  // namespace

void route_experts(const float* logits, int64_t tokens, const float* correction_bias,
                   FixedExperts fixed, const ExpertRouting& routing, int32_t* experts,
                   float* weights, cudaStream_t stream) {
  if (routing.num_experts > kMaxRoutedExperts || routing.experts_per_token > kMaxExpertsPerToken ||
      routing.experts_per_token > routing.num_experts)
    fail("route_experts: {} of {} experts (at most {} of {})", routing.experts_per_token,
         routing.num_experts, kMaxExpertsPerToken, kMaxRoutedExperts);
  if (tokens == 0) return;
  route_kernel<<<static_cast<unsigned>(tokens), kRouteThreads, 0, stream>>>(
      logits, correction_bias, fixed, routing, experts, weights);
  check_launch("route_experts");
}

size_t routed_experts_workspace_bytes(int64_t tokens, const ExpertRouting& routing, int64_t hidden,
                                      int64_t inter) {
  const int64_t pairs = tokens * routing.experts_per_token;
  const auto count = static_cast<size_t>(pairs);
  const auto items = static_cast<size_t>(max_items(pairs, routing.num_experts));
  return 3 * round_up(count * 4) + 3 * round_up(items * 4) + round_up(4) +
         round_up(count * static_cast<size_t>(2 * inter) * 4) +
         round_up(count * static_cast<size_t>(inter) * 4) +
         round_up(count * static_cast<size_t>(hidden) * 4) + fp8_rows_bytes(tokens, hidden) +
         fp8_rows_bytes(pairs, inter);
}

bool routed_experts_fit(int64_t hidden, int64_t inter, DType dtype) {
  const int per = dtype == DType::kF8E4M3 ? Fp8Chunks::kPerChunk : Bf16Chunks::kPerChunk;
  return hidden % per == 0 && inter % per == 0;
}

bool routed_experts_on_tensor_cores(int64_t hidden, int64_t inter, DType dtype) {
  return dtype == DType::kF8E4M3 && hidden % kScaleBlock == 0 && inter % kScaleBlock == 0;
}

void routed_experts(const float* x, const float* router_logits, int64_t tokens, int64_t hidden,
                    const float* correction_bias, FixedExperts fixed, const ExpertRouting& routing,
                    const ExpertWeights& weights, bool fp8_activations, void* workspace, float* out,
                    cudaStream_t stream) {
  const int64_t pairs = tokens * routing.experts_per_token;
  if (pairs > kMaxRoutedPairs)
    fail("routed_experts: {} pairs (at most {})", pairs, kMaxRoutedPairs);
  const int per = weights.dtype == DType::kF8E4M3 ? Fp8Chunks::kPerChunk : Bf16Chunks::kPerChunk;
  if (hidden % per != 0 || weights.inter % per != 0)
    fail("routed_experts: hidden {} and expert width {} must be multiples of {}", hidden,
         weights.inter, per);
  if (tokens == 0) return;
  Workspace w =
      carve(workspace, tokens, pairs, max_items(pairs, routing.num_experts), hidden, weights.inter);
  route_experts(router_logits, tokens, correction_bias, fixed, routing, w.experts, w.weights,
                stream);
  const bool mma =
      fp8_activations && routed_experts_on_tensor_cores(hidden, weights.inter, weights.dtype);
  group_by_expert_kernel<<<1, kGroupThreads, 0, stream>>>(w.experts, static_cast<int>(pairs),
                                                          routing.num_experts, w.items);
  check_launch("routed_experts (grouping)");
  if (mma) {
    run_tensor_core_products(x, tokens, routing, weights, w, stream);
  } else if (weights.dtype == DType::kF8E4M3) {
    run_chunk_products<Fp8Chunks>(x, tokens, routing, weights, w, stream);
  } else {
    run_chunk_products<Bf16Chunks>(x, tokens, routing, weights, w, stream);
  }
  combine_kernel<<<static_cast<unsigned>(tokens), 256, 0, stream>>>(
      w.expert_out, w.weights, routing.experts_per_token, hidden, out);
  check_launch("routed_experts (combine)");
}

}  // namespace deepinfer::cuda

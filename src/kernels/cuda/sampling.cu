// Ops::sample_rows on the GPU: one block per draw over its logits row, with the arithmetic of
// the host reference (kernels/draw_math.h). Masses are integers, so the block's sums come out
// the same in any order and the token equals draw_token's.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/draw_math.h"

namespace deepinfer::cuda {
namespace {

constexpr int kDrawThreads = 1024;
constexpr int kWarps = kDrawThreads / 32;
constexpr int64_t kAllTies = INT64_MAX;

// Which tokens the ranking cut keeps: keys above `key`, and the first `ties` (lowest ids)
// of those equal to it.
struct Cut {
  uint32_t key = 0;
  int64_t ties = kAllTies;
};

struct DrawShared {
  uint32_t counts[256];
  unsigned long long masses[256];
  unsigned long long scan[kWarps + 1];
  float best_value[kWarps];
  int64_t best_index[kWarps];
  double sums[kWarps];
  uint32_t prefix[2];
  unsigned long long above[2];
  int64_t token;
};

__device__ bool beats(float value, int64_t index, float other, int64_t other_index) {
  return value > other || (value == other && index < other_index);
}

// This thread's largest logit and its lowest index. A 16-byte aligned row is read four
// logits a load, eight loads in flight (one load at a time, a 128 k row took 54 us on an
// H200); each thread still meets its indices in increasing order.
__device__ void thread_max(const float* row, int64_t vocab, float& best, int64_t& best_index) {
  auto consider = [&](float value, int64_t index) {
    if (best_index == INT64_MAX || value > best) {
      best = value;
      best_index = index;
    }
  };
  int64_t scalar_from = 0;
  if (reinterpret_cast<uintptr_t>(row) % 16 == 0) {
    constexpr int kBatch = 8;
    const auto* quads = reinterpret_cast<const float4*>(row);
    const int64_t count = vocab / 4, stride = blockDim.x;
    for (int64_t base = threadIdx.x; base < count; base += stride * kBatch) {
      float4 loaded[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t q = base + j * stride;
        loaded[j] = q < count ? quads[q] : make_float4(0, 0, 0, 0);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t q = base + j * stride;
        if (q >= count) break;
        consider(loaded[j].x, 4 * q);
        consider(loaded[j].y, 4 * q + 1);
        consider(loaded[j].z, 4 * q + 2);
        consider(loaded[j].w, 4 * q + 3);
      }
    }
    scalar_from = count * 4;
  }
  for (int64_t i = scalar_from + threadIdx.x; i < vocab; i += blockDim.x) consider(row[i], i);
}

// The largest logit and its lowest index, in every thread.
__device__ void row_max(const float* row, int64_t vocab, DrawShared& sh, float& best,
                        int64_t& best_index) {
  best = -INFINITY;
  best_index = INT64_MAX;
  thread_max(row, vocab, best, best_index);
  for (int offset = 16; offset > 0; offset /= 2) {
    float other = __shfl_xor_sync(0xffffffffu, best, offset);
    int64_t other_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
    if (beats(other, other_index, best, best_index)) {
      best = other;
      best_index = other_index;
    }
  }
  if (threadIdx.x % 32 == 0) {
    sh.best_value[threadIdx.x / 32] = best;
    sh.best_index[threadIdx.x / 32] = best_index;
  }
  __syncthreads();
  best = sh.best_value[0];
  best_index = sh.best_index[0];
  for (int w = 1; w < kWarps; ++w) {
    if (beats(sh.best_value[w], sh.best_index[w], best, best_index)) {
      best = sh.best_value[w];
      best_index = sh.best_index[w];
    }
  }
  __syncthreads();
}

__device__ double block_sum(double value, DrawShared& sh) {
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  if (threadIdx.x % 32 == 0) sh.sums[threadIdx.x / 32] = value;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += sh.sums[w];
  __syncthreads();
  return total;
}

// Exclusive prefix sum over the block's threads in thread order; `total` gets the whole sum.
__device__ unsigned long long exclusive_scan(unsigned long long value, DrawShared& sh,
                                             unsigned long long& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned long long inclusive = value;
  for (int offset = 1; offset < 32; offset *= 2) {
    unsigned long long other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) sh.scan[warp] = inclusive;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long running = 0;
    for (int w = 0; w < kWarps; ++w) {
      unsigned long long warp_total = sh.scan[w];
      sh.scan[w] = running;
      running += warp_total;
    }
    sh.scan[kWarps] = running;
  }
  __syncthreads();
  unsigned long long before = sh.scan[warp] + inclusive - value;
  total = sh.scan[kWarps];
  __syncthreads();
  return before;
}

// One byte of the radix select: among keys matching prefix (under mask), the digit where the
// count (k) or mass (top-p) from the top reaches `want`. Thread 0 walks the 256 bins.
__device__ void select_digit(DrawShared& sh, int which, bool by_mass, unsigned long long want,
                             int shift) {
  unsigned long long above = sh.above[which];
  for (int digit = 255; digit >= 0; --digit) {
    unsigned long long here = by_mass ? sh.masses[digit] : sh.counts[digit];
    if (above + here >= want || digit == 0) {
      sh.prefix[which] |= static_cast<uint32_t>(digit) << shift;
      sh.above[which] = above;
      return;
    }
    above += here;
  }
}

// The ranking cut of top-k (k > 0) and top-p (need > 0): a radix select, one byte per pass,
// of the k-th key and of the key where the ranked mass reaches `need`, both in the same passes.
__device__ Cut ranking_cut(const float* row, int64_t vocab, float max_logit, float temperature,
                           int64_t k, unsigned long long need, DrawShared& sh) {
  if (threadIdx.x < 2) {
    sh.prefix[threadIdx.x] = 0;
    sh.above[threadIdx.x] = 0;
  }
  uint32_t mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (threadIdx.x < 256) {
      sh.counts[threadIdx.x] = 0;
      sh.masses[threadIdx.x] = 0;
    }
    __syncthreads();
    const uint32_t prefix_k = sh.prefix[0], prefix_p = sh.prefix[1];
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      float z = draw::scaled(row[i], max_logit, temperature);
      uint32_t key = draw::rank_key(z);
      uint32_t digit = (key >> shift) & 255u;
      if (k > 0 && (key & mask) == prefix_k) atomicAdd(&sh.counts[digit], 1u);
      if (need > 0 && (key & mask) == prefix_p) atomicAdd(&sh.masses[digit], draw::mass(z));
    }
    __syncthreads();
    if (threadIdx.x == 0 && k > 0)
      select_digit(sh, 0, false, static_cast<unsigned long long>(k), shift);
    if (threadIdx.x == 0 && need > 0) select_digit(sh, 1, true, need, shift);
    __syncthreads();
    mask |= 255u << shift;
  }
  Cut cut;
  if (k > 0) cut = {sh.prefix[0], k - static_cast<int64_t>(sh.above[0])};
  if (need > 0) {
    uint64_t each = draw::mass(draw::key_value(sh.prefix[1]));
    Cut by_mass{sh.prefix[1], static_cast<int64_t>((need - sh.above[1] + each - 1) / each)};
    bool tighter =
        k <= 0 || by_mass.key > cut.key || (by_mass.key == cut.key && by_mass.ties < cut.ties);
    if (tighter) cut = by_mass;
  }
  __syncthreads();
  return cut;
}

// The draw over the kept tokens in id order: each thread owns a contiguous run of ids, prefix
// sums give every run its starting tie rank and mass, and the run holding the target walks.
__device__ int64_t draw_kept(const float* row, int64_t vocab, float max_logit, const TokenDraw& d,
                             Cut cut, DrawShared& sh) {
  const int64_t per_thread = (vocab + blockDim.x - 1) / blockDim.x;
  const int64_t begin = min(vocab, threadIdx.x * per_thread), end = min(vocab, begin + per_thread);
  const uint64_t floor = d.min_p > 0.0f ? draw::min_p_mass(d.min_p) : 0;
  unsigned long long ties_here = 0, unused;
  for (int64_t i = begin; i < end && cut.ties != kAllTies; ++i)
    ties_here += draw::rank_key(draw::scaled(row[i], max_logit, d.temperature)) == cut.key;
  const unsigned long long tie_base = exclusive_scan(ties_here, sh, unused);
  auto walk = [&](unsigned long long start, unsigned long long target) {
    unsigned long long running = start, rank = tie_base;
    for (int64_t i = begin; i < end; ++i) {
      float z = draw::scaled(row[i], max_logit, d.temperature);
      uint32_t key = draw::rank_key(z);
      bool kept = key > cut.key || (key == cut.key && static_cast<int64_t>(rank++) < cut.ties);
      uint64_t m = draw::mass(z);
      if (!kept || m < floor) continue;
      running += m;
      if (running > target) {
        sh.token = i;
        break;
      }
    }
    return running - start;
  };
  if (threadIdx.x == 0) sh.token = -1;
  const unsigned long long mine = walk(0, ULLONG_MAX);
  unsigned long long total;
  const unsigned long long before = exclusive_scan(mine, sh, total);
  const unsigned long long target = draw::draw_target(d.uniform, total);
  if (mine > 0 && before <= target && target < before + mine) walk(before, target);
  __syncthreads();
  return sh.token;
}

__global__ void __launch_bounds__(kDrawThreads)
    sample_kernel(const float* logits, int64_t vocab, int64_t row_stride, const TokenDraw* draws,
                  DrawnToken* out) {
  __shared__ DrawShared sh;
  const TokenDraw d = draws[blockIdx.x];
  const float* row = logits + d.row * row_stride;
  float max_logit;
  int64_t best;
  row_max(row, vocab, sh, max_logit, best);
  double local = 0.0;
  unsigned long long local_mass = 0;
  const bool sampled = d.temperature != 0.0f;
  // A greedy row without a logprob needs nothing past the max: no pass of exps.
  if (sampled || d.with_logprob) {
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      if (d.with_logprob) local += ::exp(static_cast<double>(row[i] - max_logit));
      if (sampled) local_mass += draw::mass(draw::scaled(row[i], max_logit, d.temperature));
    }
  }
  const double sum = d.with_logprob ? block_sum(local, sh) : 1.0;
  int64_t token = best;
  if (sampled) {
    unsigned long long total;
    exclusive_scan(local_mass, sh, total);
    const bool top_k = d.top_k > 0 && d.top_k < vocab, top_p = d.top_p < 1.0f;
    Cut cut;
    if (top_k || top_p)
      cut = ranking_cut(row, vocab, max_logit, d.temperature, top_k ? d.top_k : 0,
                        top_p ? draw::top_p_mass(d.top_p, total) : 0, sh);
    token = draw_kept(row, vocab, max_logit, d, cut, sh);
  }
  if (threadIdx.x == 0) {
    out[blockIdx.x].token = static_cast<int32_t>(token);
    out[blockIdx.x].logprob =
        d.with_logprob ? row[token] - max_logit - static_cast<float>(::log(sum)) : 0.0f;
  }
}

// Grid (blocks over the row, masks): each thread bans the tokens it owns that its row's bits
// do not keep.
__global__ void mask_kernel(float* logits, int64_t vocab, int64_t row_stride,
                            const DeviceRowMask* masks, const uint64_t* words) {
  const DeviceRowMask mask = masks[blockIdx.y];
  float* row = logits + mask.row * row_stride;
  const uint64_t* bits = words + mask.first_word;
  for (int64_t id = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; id < vocab;
       id += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool kept = id < mask.marked && (bits[id / 64] >> (id % 64) & 1);
    if (!kept) row[id] = -INFINITY;
  }
}

}  // namespace

void mask_rows(float* logits, int64_t vocab, int64_t row_stride, const DeviceRowMask* masks,
               const uint64_t* words, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  constexpr int kThreads = 256, kPerThread = 4;
  const auto blocks =
      static_cast<unsigned>((vocab + kThreads * kPerThread - 1) / (kThreads * kPerThread));
  mask_kernel<<<dim3(std::max(blocks, 1u), static_cast<unsigned>(count)), kThreads, 0, stream>>>(
      logits, vocab, row_stride, masks, words);
  check_launch("mask_rows");
}

void sample_rows(const float* logits, int64_t vocab, int64_t row_stride, const TokenDraw* draws,
                 int64_t count, DrawnToken* out, cudaStream_t stream) {
  if (count == 0) return;
  sample_kernel<<<static_cast<unsigned>(count), kDrawThreads, 0, stream>>>(logits, vocab,
                                                                           row_stride, draws, out);
  check_launch("sample_rows");
}

}  // namespace deepinfer::cuda

// Few-rows products whose weight rows reach shared memory through the bulk-copy engine in
// large copies: each block (one a multiprocessor) owns a ring of stages, each stage a group
// of adjacent weight rows (one contiguous copy of 28-64 KB, a single instruction), filled by
// one producer lane as soon as the stage's readers release it, so a multiprocessor keeps
// 140-200 KB of its share in flight without holding registers for it and without the
// lockstep rounds of the register path (issue, wait, use, issue). Eight reader warps take
// the rows in turn; a row is summed exactly as the register path sums it (lanes striding
// over 16-byte chunks in order, then a warp reduction), so both give the same bits.
// (Session 8's per-warp rings of 1-4 KB copies lost to the copy engine's per-copy cost; this
// is the block-wide form of large copies its notes proposed.)
#pragma once

#include <cstdint>

#include "kernels/cuda/bulk_copy.cuh"
#include "kernels/cuda/overlap.cuh"
#include "kernels/cuda/staged_norm.cuh"
#include "kernels/cuda/weight_chunks.cuh"

namespace deepinfer::cuda {

constexpr int kStreamReaderWarps = 8;
constexpr int kMaxStreamStages = 8;
// Barriers first, then x, then the ring, each 128-byte aligned.
constexpr size_t kStreamBarrierBytes = 2 * kMaxStreamStages * sizeof(uint64_t);

// One product, or the gated MLP's gate and up read in lockstep (`up` not null: y = silu(x
// gate^T) * (x up^T), silu_mul_kernel's arithmetic), of x or of x normalised first (norm
// weight not null).
template <typename Chunks>
struct StreamedProduct {
  const uint4* weight;  // [n, k]
  const uint4* up;      // [n, k] or null
  Chunks format;
  float* y;  // [rows, n], written or (accumulate) added into
  int64_t n;
  bool accumulate;
  FewRowsNorm norm;
};

// The ring: `stages` buffers of `rows_per_stage` adjacent weight rows each (of gate, then as
// many of up, for a gated product).
struct StreamRing {
  int rows_per_stage;
  int stages;
};

__host__ __device__ constexpr size_t stream_x_bytes(int rows, int64_t k) {
  return (static_cast<size_t>(rows) * static_cast<size_t>(k) * sizeof(float) + 127) / 128 * 128;
}

// The producer lane: stage i of this block holds row group blockIdx.x + i * gridDim.x; a
// buffer is refilled once its previous group's readers have all arrived on its `empty`.
template <typename Chunks>
__device__ void produce_stages(const StreamedProduct<Chunks>& product, int64_t chunks,
                               StreamRing ring, int64_t my_groups, uint4* buffers, uint64_t* full,
                               uint64_t* empty) {
  const int64_t stage_chunks = ring.rows_per_stage * chunks;
  const int columns = product.up ? 2 : 1;
  for (int64_t i = 0; i < my_groups; ++i) {
    const int slot = static_cast<int>(i % ring.stages);
    if (i >= ring.stages)
      await_phase(&empty[slot], static_cast<uint32_t>((i / ring.stages - 1) & 1));
    const int64_t first_row = (blockIdx.x + i * gridDim.x) * int64_t{ring.rows_per_stage};
    const int64_t rows = min(int64_t{ring.rows_per_stage}, product.n - first_row);
    const auto bytes = static_cast<uint32_t>(rows * chunks * sizeof(uint4));
    uint4* buffer = buffers + slot * stage_chunks * columns;
    arrive_expecting(&full[slot], columns * bytes);
    copy_bytes(buffer, product.weight + first_row * chunks, bytes, &full[slot]);
    if (product.up)
      copy_bytes(buffer + stage_chunks, product.up + first_row * chunks, bytes, &full[slot]);
  }
}

// The warp's finished sums for one job: written or added into y, or for a gated product
// silu(gate) * up written, by lane 0.
template <int kRows, int kColumns, typename Chunks>
__device__ void store_sums(const StreamedProduct<Chunks>& product, int64_t column,
                           const float (&acc)[kColumns][kRows]) {
  float sums[kColumns][kRows];
#pragma unroll
  for (int j = 0; j < kColumns; ++j) {
#pragma unroll
    for (int q = 0; q < kRows; ++q) {
      float sum = acc[j][q];
      for (int offset = 16; offset > 0; offset /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      sums[j][q] = sum;
    }
  }
  if (threadIdx.x % 32 != 0) return;
#pragma unroll
  for (int q = 0; q < kRows; ++q) {
    float& out = product.y[q * product.n + column];
    if constexpr (kColumns == 2) {
      const float gate = sums[0][q];
      out = gate / (1.0f + expf(-gate)) * sums[1][q];
    } else {
      out = product.accumulate ? out + sums[0][q] : sums[0][q];
    }
  }
}

// A reader warp's jobs: warp, warp + 8, ... in ring order (job j is row j % R of stage j / R:
// that row of the weight, and of up for a gated product), so a warp waits only on stages
// whose earlier stages are already being read. A lane adds its chunks in order, as the
// register path does.
template <int kRows, bool kGated, typename Chunks>
__device__ void read_stages(const StreamedProduct<Chunks>& product, const float* x, int64_t k,
                            StreamRing ring, int64_t my_groups, const uint4* buffers,
                            uint64_t* full, uint64_t* empty) {
  constexpr int kPer = Chunks::kPerChunk, kColumns = kGated ? 2 : 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t chunks = k / kPer, stage_chunks = ring.rows_per_stage * chunks;
  for (int64_t job = warp; job < my_groups * ring.rows_per_stage; job += kStreamReaderWarps) {
    const int64_t i = job / ring.rows_per_stage;
    const int r = static_cast<int>(job % ring.rows_per_stage);
    const int slot = static_cast<int>(i % ring.stages);
    const int64_t column = (blockIdx.x + i * gridDim.x) * int64_t{ring.rows_per_stage} + r;
    await_phase(&full[slot], static_cast<uint32_t>((i / ring.stages) & 1));
    float acc[kColumns][kRows] = {};
    if (column < product.n) {
      const uint4* row = buffers + slot * stage_chunks * kColumns + r * chunks;
      for (int64_t chunk = lane; chunk < chunks; chunk += 32) {
#pragma unroll
        for (int j = 0; j < kColumns; ++j) {
          float w[kPer];
          product.format.widen(row[j * stage_chunks + chunk], w);
          const float scale = product.format.scale(column, chunk);
#pragma unroll
          for (int q = 0; q < kRows; ++q)
            acc[j][q] += chunk_dot<kPer>(w, x + q * k + chunk * kPer) * scale;
        }
      }
    }
    __syncwarp();
    if (lane == 0) arrive(&empty[slot]);
    if (column < product.n) store_sums<kRows, kColumns>(product, column, acc);
  }
}

// The readers only (the producer warp never joins): named barrier 1.
__device__ __forceinline__ void sync_readers() {
  asm volatile("bar.sync 1, %0;" ::"n"(kStreamReaderWarps * 32) : "memory");
}

// Block: eight reader warps and one producer warp; dynamic shared memory laid out as
// kStreamBarrierBytes of barriers, x [kRows, k] (stream_x_bytes) and the ring.
template <int kRows, bool kGated, typename Chunks>
__global__ void __launch_bounds__((kStreamReaderWarps + 1) * 32, 1)
    streamed_rows_kernel(const float* __restrict__ x_global, StreamedProduct<Chunks> product,
                         int64_t k, StreamRing ring) {
  static_assert(kStreamReaderWarps == kNormWarps, "the readers normalise x");
  extern __shared__ __align__(128) unsigned char stream_shared[];
  auto* full = reinterpret_cast<uint64_t*>(stream_shared);
  uint64_t* empty = full + kMaxStreamStages;
  auto* x = reinterpret_cast<float*>(stream_shared + kStreamBarrierBytes);
  auto* buffers =
      reinterpret_cast<uint4*>(stream_shared + kStreamBarrierBytes + stream_x_bytes(kRows, k));
  const int64_t chunks = k / Chunks::kPerChunk;
  const int64_t groups = (product.n + ring.rows_per_stage - 1) / ring.rows_per_stage;
  const int64_t my_groups =
      groups > blockIdx.x ? (groups - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ring.stages; ++s) {
      init_barrier(&full[s], 1);
      init_barrier(&empty[s], ring.rows_per_stage);
    }
    publish_copy_barriers();
  }
  __syncthreads();
  release_dependents();
  if (threadIdx.x / 32 == kStreamReaderWarps) {
    // Weights are no kernel's output: their copies start before the previous kernel ends.
    if (threadIdx.x % 32 == 0)
      produce_stages(product, chunks, ring, my_groups, buffers, full, empty);
    return;
  }
  await_producer();
  const auto* from = reinterpret_cast<const float4*>(x_global);
  auto* to = reinterpret_cast<float4*>(x);
  for (int64_t i = threadIdx.x; i < kRows * k / 4; i += kStreamReaderWarps * 32) to[i] = from[i];
  sync_readers();
  if (product.norm.weight) normalise_staged<kRows>(x, k, product.norm, [] { sync_readers(); });
  read_stages<kRows, kGated>(product, x, k, ring, my_groups, buffers, full, empty);
}

}  // namespace deepinfer::cuda

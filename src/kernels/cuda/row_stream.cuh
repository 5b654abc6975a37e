// Few-rows products whose weight rows reach shared memory through the bulk-copy engine in
// large copies: each block (one a multiprocessor) owns a ring of stages, each stage the
// weight rows of a group of consecutive jobs (one contiguous copy of 28-64 KB where the rows
// are adjacent, a single instruction), filled by one producer lane as soon as the stage's
// readers release it, so a multiprocessor keeps 140-200 KB of its share in flight without
// holding registers for it and without the lockstep rounds of the register path (issue,
// wait, use, issue). Eight reader warps take the jobs in turn; a row is summed exactly as
// the register path sums it (lanes striding over 16-byte chunks in order, then a warp
// reduction), so both give the same bits.
// (Per-warp rings of 1-4 KB copies measured slower than registers on the H200: each copy costs
// the copy unit a fixed ~150-200 cycles, so only large block-wide copies pay.)
//
// A job source (Jobs) says what a warp job reads and where its sums go:
//   Chunks format; FewRowsNorm norm; int64_t count;     the jobs, and x's norm (or none)
//   static constexpr int kColumns;                      weight rows a job reads (1 or 2)
//   static constexpr bool kAdjacentRows;                job j's rows follow job j - 1's
//   const uint4* row(int64_t job, int j) const;         its j-th weight row
//   int64_t column(int64_t job, int j) const;           that row's index (FP8 scales)
//   void store(int64_t job, int row, const float (&sums)[kColumns]) const;   lane 0, x row
#pragma once

#include <cstdint>

#include "kernels/cuda/bulk_copy.cuh"
#include "kernels/cuda/overlap.cuh"
#include "kernels/cuda/row_stream_settings.h"
#include "kernels/cuda/staged_norm.cuh"
#include "kernels/cuda/weight_chunks.cuh"

namespace deepinfer::cuda {

constexpr int kStreamReaderWarps = 8;
// Barriers first, then x, then the ring, each 128-byte aligned.
constexpr size_t kStreamBarrierBytes = 2 * kMaxStreamStages * sizeof(uint64_t);

// One product of x (or of x normalised first): y = x W^T, or y += x W^T.
template <typename Chunks>
struct PlainJobs {
  static constexpr int kColumns = 1;
  static constexpr bool kAdjacentRows = true;
  Chunks format;
  FewRowsNorm norm;
  int64_t count;  // W's rows
  const uint4* weight;
  int64_t chunks;  // a row's 16-byte chunks
  float* y;        // [rows, count]
  bool accumulate;
  __device__ const uint4* row(int64_t job, int) const { return weight + job * chunks; }
  __device__ int64_t column(int64_t job, int) const { return job; }
  __device__ void store(int64_t job, int r, const float (&sums)[1]) const {
    float& out = y[r * count + job];
    out = accumulate ? out + sums[0] : sums[0];
  }
};

// The gated MLP's first half: y = silu(x' gate^T) * (x' up^T), silu_mul_kernel's arithmetic.
struct GatedJobs {
  static constexpr int kColumns = 2;
  static constexpr bool kAdjacentRows = true;
  Bf16Chunks format;
  FewRowsNorm norm;
  int64_t count;  // rows of gate (and of up)
  const uint4* gate;
  const uint4* up;
  int64_t chunks;
  float* y;  // [rows, count]
  __device__ const uint4* row(int64_t job, int j) const { return (j ? up : gate) + job * chunks; }
  __device__ int64_t column(int64_t job, int) const { return job; }
  __device__ void store(int64_t job, int r, const float (&sums)[2]) const {
    const float g = sums[0];
    y[r * count + job] = g / (1.0f + expf(-g)) * sums[1];
  }
};

// bytes from global `source` into shared `destination` in copies of at most `limit` bytes,
// all counted against `barrier`.
__device__ inline void copy_in_pieces(uint4* destination, const uint4* source, uint32_t bytes,
                                      uint32_t limit, uint64_t* barrier) {
  for (uint32_t offset = 0; offset < bytes; offset += limit)
    copy_bytes(destination + offset / sizeof(uint4), source + offset / sizeof(uint4),
               min(limit, bytes - offset), barrier);
}

__host__ __device__ constexpr size_t stream_x_bytes(int rows, int64_t k) {
  return (static_cast<size_t>(rows) * static_cast<size_t>(k) * sizeof(float) + 127) / 128 * 128;
}

// The shared memory before the ring: barriers, x [rows, k] and the norm's weights.
__host__ __device__ constexpr size_t stream_staging_bytes(int rows, int64_t k,
                                                          const FewRowsNorm& norm) {
  return kStreamBarrierBytes + stream_x_bytes(rows, k) + norm_weight_bytes(norm, k);
}

// The producer lane: stage i of this block holds job group blockIdx.x + i * gridDim.x; a
// buffer is refilled once its previous group's readers have all arrived on its `empty`.
// `issued` counts the stages whose copies have started (see read_stages).
template <typename Jobs>
__device__ void produce_stages(const Jobs& jobs, int64_t chunks, StreamRing ring, int64_t my_groups,
                               uint4* buffers, uint64_t* full, uint64_t* empty, int* issued) {
  constexpr int kColumns = Jobs::kColumns;
  const int64_t stage_chunks = ring.jobs_per_stage * chunks;
  const auto row_bytes = static_cast<uint32_t>(chunks * sizeof(uint4));
  for (int64_t i = 0; i < my_groups; ++i) {
    const int slot = static_cast<int>(i % ring.stages);
    if (i >= ring.stages)
      await_phase(&empty[slot], static_cast<uint32_t>((i / ring.stages - 1) & 1));
    const int64_t first = (blockIdx.x + i * gridDim.x) * int64_t{ring.jobs_per_stage};
    const auto count = static_cast<uint32_t>(min(int64_t{ring.jobs_per_stage}, jobs.count - first));
    uint4* buffer = buffers + slot * stage_chunks * kColumns;
    arrive_expecting(&full[slot], kColumns * count * row_bytes);
    publish_count(issued, static_cast<int>(i + 1));
#pragma unroll
    for (int j = 0; j < kColumns; ++j) {
      if constexpr (Jobs::kAdjacentRows) {
        copy_in_pieces(buffer + j * stage_chunks, jobs.row(first, j), count * row_bytes,
                       ring.copy_limit, &full[slot]);
      } else {
        for (uint32_t r = 0; r < count; ++r)
          copy_in_pieces(buffer + j * stage_chunks + r * chunks, jobs.row(first + r, j), row_bytes,
                         ring.copy_limit, &full[slot]);
      }
    }
  }
}

// The warp's sums of one job added across lanes and handed to the job source by lane 0.
template <int kRows, typename Jobs>
__device__ void store_sums(const Jobs& jobs, int64_t job,
                           const float (&acc)[Jobs::kColumns][kRows]) {
  float sums[Jobs::kColumns][kRows];
  add_across_warp(acc, sums);
  if (threadIdx.x % 32 != 0) return;
#pragma unroll
  for (int q = 0; q < kRows; ++q) {
    float row_sums[Jobs::kColumns];
#pragma unroll
    for (int j = 0; j < Jobs::kColumns; ++j) row_sums[j] = sums[j][q];
    jobs.store(job, q, row_sums);
  }
}

// A reader warp's jobs: warp, warp + 8, ... in ring order (job j is the (j % R)-th of stage
// j / R). A lane adds its chunks in order, as the register path does.
// A warp may run more than a ring ahead of the stage its buffer holds (eight warps over
// fewer than eight jobs a round): a parity wait then names a phase the barrier has not
// begun and, parities repeating, passes at once. So a reader first waits until the stage's
// copies have started (`issued`): its buffer's previous phase is then complete, and the
// parity names the current one.
template <int kRows, typename Jobs>
__device__ void read_stages(const Jobs& jobs, const float* x, int64_t k, StreamRing ring,
                            int64_t my_groups, const uint4* buffers, uint64_t* full,
                            uint64_t* empty, const int* issued) {
  constexpr int kPer = decltype(jobs.format)::kPerChunk, kColumns = Jobs::kColumns;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t chunks = k / kPer, stage_chunks = ring.jobs_per_stage * chunks;
  for (int64_t n = warp; n < my_groups * ring.jobs_per_stage; n += kStreamReaderWarps) {
    const int64_t i = n / ring.jobs_per_stage;
    const int r = static_cast<int>(n % ring.jobs_per_stage);
    const int slot = static_cast<int>(i % ring.stages);
    const int64_t job = (blockIdx.x + i * gridDim.x) * int64_t{ring.jobs_per_stage} + r;
    if (i >= ring.stages) await_count(issued, static_cast<int>(i + 1));
    await_phase(&full[slot], static_cast<uint32_t>((i / ring.stages) & 1));
    float acc[kColumns][kRows] = {};
    if (job < jobs.count) {
      const uint4* row = buffers + slot * stage_chunks * kColumns + r * chunks;
      int64_t columns[kColumns];
#pragma unroll
      for (int j = 0; j < kColumns; ++j) columns[j] = jobs.column(job, j);
      for (int64_t chunk = lane; chunk < chunks; chunk += 32) {
#pragma unroll
        for (int j = 0; j < kColumns; ++j)
          add_chunk<kRows>(jobs.format, row[j * stage_chunks + chunk], columns[j], chunk, x, k,
                           acc[j]);
      }
    }
    __syncwarp();
    if (lane == 0) arrive(&empty[slot]);
    if (job < jobs.count) store_sums<kRows>(jobs, job, acc);
  }
}

// The readers only (the producer warp never joins): named barrier 1.
__device__ __forceinline__ void sync_readers() {
  asm volatile("bar.sync 1, %0;" ::"n"(kStreamReaderWarps * 32) : "memory");
}

// Block: eight reader warps and one producer warp; dynamic shared memory laid out as
// kStreamBarrierBytes of barriers, x [kRows, k] (stream_x_bytes), the norm's weights
// (norm_weight_bytes) and the ring.
template <int kRows, typename Jobs>
__global__ void __launch_bounds__((kStreamReaderWarps + 1) * 32, 1)
    streamed_rows_kernel(const float* __restrict__ x_global, Jobs jobs, int64_t k,
                         StreamRing ring) {
  static_assert(kStreamReaderWarps == kNormWarps, "the readers normalise x");
  extern __shared__ __align__(128) unsigned char stream_shared[];
  auto* full = reinterpret_cast<uint64_t*>(stream_shared);
  uint64_t* empty = full + kMaxStreamStages;
  auto* x = reinterpret_cast<float*>(stream_shared + kStreamBarrierBytes);
  auto* buffers =
      reinterpret_cast<uint4*>(stream_shared + stream_staging_bytes(kRows, k, jobs.norm));
  const int64_t chunks = k / decltype(jobs.format)::kPerChunk;
  const int64_t groups = (jobs.count + ring.jobs_per_stage - 1) / ring.jobs_per_stage;
  const int64_t my_groups =
      groups > blockIdx.x ? (groups - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  __shared__ int issued;
  if (threadIdx.x == 0) {
    issued = 0;
    for (int s = 0; s < ring.stages; ++s) {
      init_barrier(&full[s], 1);
      init_barrier(&empty[s], ring.jobs_per_stage);
    }
    publish_copy_barriers();
  }
  __syncthreads();
  release_dependents();
  if (threadIdx.x / 32 == kStreamReaderWarps) {
    // Weights are no kernel's output: their copies start before the previous kernel ends.
    if (threadIdx.x % 32 == 0)
      produce_stages(jobs, chunks, ring, my_groups, buffers, full, empty, &issued);
    return;
  }
  const void* norm_weights = prefetch_norm_weights(
      jobs.norm, k, stream_shared + kStreamBarrierBytes + stream_x_bytes(kRows, k),
      kStreamReaderWarps * 32);
  await_producer();
  const auto* from = reinterpret_cast<const float4*>(x_global);
  auto* to = reinterpret_cast<float4*>(x);
  for (int64_t i = threadIdx.x; i < kRows * k / 4; i += kStreamReaderWarps * 32) to[i] = from[i];
  await_norm_weights();
  sync_readers();
  if (jobs.norm.weight)
    normalise_staged<kRows>(x, k, jobs.norm, norm_weights, [] { sync_readers(); });
  read_stages<kRows>(jobs, x, k, ring, my_groups, buffers, full, empty, &issued);
}

}  // namespace deepinfer::cuda

// The row stream's host-side choices (row_stream.cuh): which products stream, how large each
// bulk copy is, and the ring of stages that fits a block's shared memory. Which products
// stream comes from DEEPINFER_CUDA_ROW_STREAM at start or from cuda_kernels.h's setters.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

constexpr int kMaxStreamStages = 8;

// The ring: `stages` buffers, each the rows of `jobs_per_stage` consecutive jobs (all their
// first rows, then all their second rows).
struct StreamRing {
  int jobs_per_stage;
  int stages;
  uint32_t copy_limit;  // the most bytes one bulk copy moves (a multiple of 16)
};

// The StreamUse bits in force (DEEPINFER_CUDA_ROW_STREAM, else kDefaultRowStream).
int& row_stream_setting();
// The ring that keeps the most bytes in flight with at least three stages (so one can be read
// while two fill) in `room` bytes of shared memory, for jobs of `job_bytes`; false if none
// fits.
bool choose_ring(int64_t room, int64_t job_bytes, StreamRing& ring);

}  // namespace deepinfer::cuda

#include "kernels/cuda/row_stream_settings.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"

namespace deepinfer::cuda {
namespace {

long environment_number(const char* name, long otherwise) {
  const char* setting = std::getenv(name);
  return setting ? std::strtol(setting, nullptr, 10) : otherwise;
}

// The most bytes one bulk copy moves: 16 KB unless set otherwise (session 8 measured 1-4 KB
// copies too small to feed a multiprocessor; session 11 found 16-64 KB alike).
uint32_t& copy_limit() {
  static uint32_t limit = static_cast<uint32_t>(
      std::clamp(environment_number("DEEPINFER_CUDA_ROW_STREAM_COPY_KB", 16), 1L, 1024L) << 10);
  return limit;
}

// The most shared memory a row-stream block takes (0: all it may).
int64_t& shared_limit() {
  static int64_t limit = std::max(0L, environment_number("DEEPINFER_CUDA_ROW_STREAM_SHARED_KB", 0))
                         << 10;
  return limit;
}

// The most stages a ring may have: kMaxStreamStages unless DEEPINFER_CUDA_ROW_STREAM_STAGES
// says fewer; when set, rings of equal bytes prefer more, smaller stages. (Session 11: 12 and
// 16 stages of a 16-stage build were slower than 8 large ones, 194 and 198 against 201
// tok/s: the bulk-copy engine favours fewer, larger copies.)
int stage_limit() {
  static const int limit = [] {
    const long setting = environment_number("DEEPINFER_CUDA_ROW_STREAM_STAGES", 0);
    return setting == 0 ? 0 : static_cast<int>(std::clamp(setting, 3L, long{kMaxStreamStages}));
  }();
  return limit;
}

}  // namespace

int& row_stream_setting() {
  static int uses =
      static_cast<int>(environment_number("DEEPINFER_CUDA_ROW_STREAM", kDefaultRowStream));
  return uses;
}

int64_t row_stream_shared_room(int64_t most) {
  return shared_limit() > 0 ? std::min(shared_limit(), most) : most;
}

bool choose_ring(int64_t room, int64_t job_bytes, StreamRing& ring) {
  int64_t best = 0;
  const int most_stages = stage_limit() > 0 ? stage_limit() : kMaxStreamStages;
  for (int step = 0; step < 8; ++step) {
    const int per_stage = stage_limit() > 0 ? step + 1 : 8 - step;
    const int64_t stage_bytes = per_stage * job_bytes;
    const int64_t stages = std::min<int64_t>(most_stages, room / stage_bytes);
    if (stages >= 3 && stages * stage_bytes > best) {
      best = stages * stage_bytes;
      ring = {per_stage, static_cast<int>(stages), copy_limit()};
    }
  }
  return best > 0;
}

void set_row_stream(int uses) {
  row_stream_setting() = uses;
}

int row_stream() {
  return row_stream_setting();
}

void set_row_stream_copy_limit(uint32_t bytes) {
  if (bytes < 16 || bytes % 16 != 0)
    fail("row stream: copies of {} bytes (a multiple of 16)", bytes);
  copy_limit() = bytes;
}

void set_row_stream_shared_limit(int64_t bytes) {
  if (bytes < 0) fail("row stream: a shared-memory limit of {} bytes", bytes);
  shared_limit() = bytes;
}

}  // namespace deepinfer::cuda

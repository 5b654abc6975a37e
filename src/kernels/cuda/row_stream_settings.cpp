#include "kernels/cuda/row_stream_settings.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"

namespace deepinfer::cuda {
namespace {

// The most bytes one bulk copy moves: 16 KB unless a test sets otherwise. On the H200,
// 1-4 KB copies were too few bytes a copy to feed a multiprocessor (each costs the copy unit
// a fixed ~150-200 cycles), and 16, 32, 64 and 128 KB copies measured alike.
uint32_t& copy_limit() {
  static uint32_t limit = 16u << 10;
  return limit;
}

}  // namespace

int& row_stream_setting() {
  static int uses = [] {
    const char* setting = std::getenv("DEEPINFER_CUDA_ROW_STREAM");
    return setting ? static_cast<int>(std::strtol(setting, nullptr, 10)) : kDefaultRowStream;
  }();
  return uses;
}

// Rings of equal bytes prefer fewer, larger stages: on the H200, 12 and 16 stages were
// slower than 8 large ones (194 and 198 against 201 tok/s at batch 1).
bool choose_ring(int64_t room, int64_t job_bytes, StreamRing& ring) {
  int64_t best = 0;
  for (int per_stage = 8; per_stage >= 1; --per_stage) {
    const int64_t stage_bytes = per_stage * job_bytes;
    const int64_t stages = std::min<int64_t>(kMaxStreamStages, room / stage_bytes);
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

}  // namespace deepinfer::cuda

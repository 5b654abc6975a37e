// Where DeepSeek-V4's attention kernels find things: a batch row's sequence and position,
// its first window row, and elements of paged records and of compressed entries striped over
// them.
#pragma once

#include <cstdint>

#include "kernels/cuda/deepseek_v4_kernels.h"

namespace deepinfer::cuda {

__device__ inline float* record_at(const DeviceRecords& r, int seq, int64_t position,
                                   int64_t element) {
  const int64_t e = r.offset + element;
  const int layer = static_cast<int>(e / r.row);
  const int32_t block =
      r.tables[layer][static_cast<int64_t>(seq) * r.max_blocks_per_seq + position / r.block_size];
  return r.layers[layer] +
         (static_cast<int64_t>(block) * r.block_size + position % r.block_size) * r.row + e % r.row;
}

// Element c of entry w.
__device__ inline float* entry_at(const DeviceStripes& s, int seq, int64_t w, int64_t c) {
  return record_at(s.records, seq, w * s.rate + c / s.stripe, c % s.stripe);
}

// Elements c..c+3 of entry w: one 16-byte load when the stripes keep 4-float groups whole and
// aligned (`vectorised`, see stripes_vectorised), else four.
__device__ inline float4 entry_quad(const DeviceStripes& entries, bool vectorised, int seq,
                                    int64_t w, int64_t c) {
  if (vectorised) return *reinterpret_cast<const float4*>(entry_at(entries, seq, w, c));
  return make_float4(*entry_at(entries, seq, w, c), *entry_at(entries, seq, w, c + 1),
                     *entry_at(entries, seq, w, c + 2), *entry_at(entries, seq, w, c + 3));
}

// Whether every aligned group of 4 entry elements starting at `offset` is one 16-byte load.
inline bool stripes_vectorised(const DeviceStripes& entries, int64_t offset) {
  return entries.stripe % 4 == 0 && entries.records.row % 4 == 0 &&
         entries.records.offset % 4 == 0 && offset % 4 == 0;
}

// The first window row a query at `position` reads (a replayed prefix's windows start at its
// first position).
__device__ inline int64_t window_first(const DeviceRows& rows, int seq, int64_t position,
                                       int window) {
  const int64_t start = rows.first_positions ? rows.first_positions[seq] : 0;
  return max(start, position - window + 1);
}

// The sequence and position of batch row t.
__device__ inline void place_of(const DeviceRows& rows, int64_t t, int& seq, int64_t& position) {
  int lo = 0, hi = rows.num_seqs - 1;
  while (lo < hi) {  // the last sequence whose first row is at or before t
    int mid = (lo + hi + 1) / 2;
    if (rows.query_start[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  seq = lo;
  position = rows.context_lens[lo] - (rows.query_start[lo + 1] - t);
}

}  // namespace deepinfer::cuda

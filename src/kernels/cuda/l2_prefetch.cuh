// Asking the copy engine to bring a contiguous range of global memory into L2, without
// waiting and without holding registers or shared memory: what a kernel knows it will read
// soon (weights) it can request while it still waits for its predecessor.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

// bytes: a multiple of 16; source 16-byte aligned.
__device__ __forceinline__ void prefetch_to_l2(const void* source, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(source), "r"(bytes) : "memory");
}

}  // namespace deepinfer::cuda

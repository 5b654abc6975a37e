// The Hopper bulk-copy engine (cp.async.bulk) filling shared memory from global memory, with
// an mbarrier per buffer that completes when its bytes have landed: loads in flight that hold
// no registers, so a warp can keep many kilobytes of a weight stream outstanding.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// A barrier whose phase completes after `arrivals` arrivals (and, for one a copy names, the
// copy's bytes). Make the initialisation visible to the copy engine before the first copy
// names it.
__device__ __forceinline__ void init_barrier(uint64_t* barrier, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(barrier)),
               "r"(arrivals)
               : "memory");
}
__device__ __forceinline__ void publish_copy_barriers() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// This thread's arrival on `barrier`, whose current phase now also waits for `bytes` more to
// land from the copies that name it.
__device__ __forceinline__ void arrive_expecting(uint64_t* barrier, uint32_t bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)),
      "r"(bytes)
      : "memory");
}

// bytes (a multiple of 16, both addresses 16-byte aligned) from global `source` into shared
// `destination`, counted against `barrier`'s expected bytes when they land.
__device__ __forceinline__ void copy_bytes(void* destination, const void* source, uint32_t bytes,
                                           uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(shared_address(destination)),
      "l"(source), "r"(bytes), "r"(shared_address(barrier))
      : "memory");
}

// Spins until the barrier's phase of the given parity (0 for its first use, then 1, 0, ...)
// has completed.
__device__ __forceinline__ void await_phase(uint64_t* barrier, uint32_t parity) {
  const uint32_t barrier_address = shared_address(barrier);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred complete;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        "selp.u32 %0, 1, 0, complete;\n"
        "}\n"
        : "=r"(done)
        : "r"(barrier_address), "r"(parity)
        : "memory");
  } while (!done);
}

// One arrival on the barrier (this thread is done with what the barrier guards).
__device__ __forceinline__ void arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(barrier))
               : "memory");
}

// A count in shared memory that one thread raises and others wait on: the release store
// carries what the thread saw before it (barrier phases it awaited) to whoever acquires it.
__device__ __forceinline__ void publish_count(int* counter, int value) {
  asm volatile("st.release.cta.shared::cta.b32 [%0], %1;" ::"r"(shared_address(counter)), "r"(value)
               : "memory");
}
__device__ __forceinline__ void await_count(const int* counter, int at_least) {
  int value = 0;
  do {
    asm volatile("ld.acquire.cta.shared::cta.b32 %0, [%1];"
                 : "=r"(value)
                 : "r"(shared_address(counter))
                 : "memory");
  } while (value < at_least);
}

}  // namespace deepinfer::cuda

// Programmatic dependent launch (sm_90): a kernel launched with launch_overlapped may have its
// blocks placed on the GPU while the kernel before it in the stream is still finishing, so
// the launch latency and the predecessor's tail are hidden. Such a kernel must call
// await_producer() before it reads or writes anything an earlier kernel touches; what it
// does before that (a product's first weight loads) overlaps the predecessor. Kernels call
// release_dependents() early so that the next kernel may start as soon as all of their own
// blocks are running. Both are no-ops for kernels launched the ordinary way, and CUDA graph
// capture keeps the overlap (programmatic edges).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/cuda_kernels.h"

namespace deepinfer::cuda {

__device__ __forceinline__ void release_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Returns once the previous kernel in the stream has completed and its writes are visible.
__device__ __forceinline__ void await_producer() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), allowed to overlap its predecessor
// when `may_overlap` (and overlap_launches()). A launch error is left for check_launch, as
// with <<<>>>.
template <typename... Params, typename... Args>
void launch_maybe_overlapped(bool may_overlap, void (*kernel)(Params...), dim3 grid, dim3 block,
                             size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = may_overlap && overlap_launches() ? 1 : 0;
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}
template <typename... Params, typename... Args>
void launch_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                       cudaStream_t stream, Args&&... args) {
  launch_maybe_overlapped(true, kernel, grid, block, shared_bytes, stream,
                          std::forward<Args>(args)...);
}

}  // namespace deepinfer::cuda

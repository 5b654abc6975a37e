// The CUDA backend behind the op seam: weights, activations, KV blocks and batch tables live
// in device memory (stream-ordered allocations on one stream), every op runs as kernels on
// that stream, and only logits and MoE routing decisions come back to the host.
#pragma once

#include <memory>

#include "kernels/ops.h"

namespace deepinfer::cuda {

// The backend on GPU `device`; an Error naming the reason when there is no usable GPU.
// kBf16 runs prompt products on cuBLASLt with activations rounded to bf16, and DeepSeek-V4's
// indexer scores and sparse attention over prompts on the tensor cores; kF32 keeps them in
// f32 (plain tiled kernels: exact, far slower), for models whose choices (DeepSeek-V4's top-k
// indexer) turn on differences that rounding makes.
std::unique_ptr<Ops> make_cuda_ops(int device = 0,
                                   MatmulPrecision precision = MatmulPrecision::kBf16);

// The ceilings benchmarks state GPU results against, measured on the current device:
// device-to-device copy (bytes read plus written per second, best of 10 copies of 2 GiB) and
// cuBLASLt's bf16 rate on an 8192^3 product with f32 activations cast to bf16 first, as our
// prompt matmuls run (best of 5).
struct DeviceCeilings {
  double copy_bytes_per_s = 0;
  double bf16_flops_per_s = 0;
};
DeviceCeilings measure_device_ceilings();

}  // namespace deepinfer::cuda

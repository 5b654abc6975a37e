// Prompt-sized MoE layers with DeepSeek-style FP8 experts on cuBLASLt: every pair's row of x
// is gathered and quantised to e4m3 in one launch, each expert's gate, up and down products
// read their slice of that copy, and the activations are quantised in one launch too (the
// general path quantises each product's input on its own: three launches an expert).
#pragma once

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/ops.h"

namespace deepinfer::cuda {

// Whether every expert is an e4m3 weight with 128 x 128 block scales, all of one width, in
// shapes cuBLASLt's FP8 products take.
bool fp8_grouped_experts_fit(const RoutedExperts& experts, int64_t hidden);

// out [T, hidden] += the experts' weighted outputs for the grouped pairs of x [T, hidden].
// False, with nothing launched, when cuBLASLt has no FP8 algorithm for one of the shapes.
bool fp8_grouped_experts(Ops& ops, LtMatmul& lt, const Tensor& x, const RoutedExperts& experts,
                         const ExpertGroups& groups, Tensor& out, cudaStream_t stream);

}  // namespace deepinfer::cuda

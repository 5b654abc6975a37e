// Mixture-of-experts routing on the CPU (the reference for other backends).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"

namespace deepinfer::cpu {

// One token: its router logits [num_experts] to experts/weights [experts_per_token];
// `fixed` (may be null) names the experts instead of the scores choosing them.
void route_token(const float* logits, const std::vector<float>& correction_bias,
                 const ExpertRouting& routing, const int32_t* fixed, int32_t* experts,
                 float* weights);

}  // namespace deepinfer::cpu

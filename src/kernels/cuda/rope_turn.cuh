// The rotary turn of one (x0, x1) pair, written with explicit roundings: the compiler may
// contract `x0 * c - x1 * s` into either of two fused multiply-adds, and it chooses per call
// site, so kernels that must give the same bits (rope_kv_write and the fused q/k/v products)
// share this one.
#pragma once

namespace deepinfer::cuda {

struct Turned {
  float first, second;
};

__device__ inline Turned rope_turn(float x0, float x1, float c, float s) {
  return {__fmaf_rn(x0, c, -__fmul_rn(x1, s)), __fmaf_rn(x1, c, __fmul_rn(x0, s))};
}

}  // namespace deepinfer::cuda

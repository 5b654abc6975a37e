// The arithmetic of Ops::sample_rows, shared by the host reference (draw_token) and the GPU
// kernel so both compute bit-identical masses, ranking keys and targets.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DEEPINFER_HOST_DEVICE __host__ __device__
#else
#define DEEPINFER_HOST_DEVICE
#endif

namespace deepinfer::draw {

// The most likely token's mass. Tokens under 2^-40 of it weigh nothing: a draw lands on one
// with probability below 1e-12.
inline constexpr double kBestMass = 1099511627776.0;  // 2^40

// The logit relative to the best one, at the temperature (<= 0).
DEEPINFER_HOST_DEVICE inline float scaled(float logit, float max_logit, float temperature) {
  return (logit - max_logit) / temperature;
}

// A token's integer weight: exp(scaled) of the best one's kBestMass. Below -28 that is under
// 1 and rounds to 0 without the exponential (most of a trained model's vocabulary).
DEEPINFER_HOST_DEVICE inline uint64_t mass(float scaled_logit) {
  if (scaled_logit < -28.0f) return 0;
  return static_cast<uint64_t>(::exp(static_cast<double>(scaled_logit)) * kBestMass);
}

// Orders floats as unsigned integers (larger float, larger key), for the radix select.
DEEPINFER_HOST_DEVICE inline uint32_t rank_key(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
}

DEEPINFER_HOST_DEVICE inline float key_value(uint32_t key) {
  uint32_t bits = (key & 0x80000000u) != 0 ? (key & 0x7fffffffu) : ~key;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// The mass the ranked prefix must reach for top_p (0 < top_p < 1) of `total`.
DEEPINFER_HOST_DEVICE inline uint64_t top_p_mass(float top_p, uint64_t total) {
  return static_cast<uint64_t>(::ceil(static_cast<double>(top_p) * static_cast<double>(total)));
}

// Tokens lighter than this fall to min_p.
DEEPINFER_HOST_DEVICE inline uint64_t min_p_mass(float min_p) {
  return static_cast<uint64_t>(::ceil(static_cast<double>(min_p) * kBestMass));
}

// The draw picks the first kept token (in id order) whose running mass exceeds this.
DEEPINFER_HOST_DEVICE inline uint64_t draw_target(double uniform, uint64_t kept_total) {
  return static_cast<uint64_t>(uniform * static_cast<double>(kept_total));
}

}  // namespace deepinfer::draw

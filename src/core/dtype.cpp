#include "core/dtype.h"

#include <array>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace deepinfer {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kI64:
      return 8;
    case DType::kF8E4M3:
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
  }
  return "?";
}

DType dtype_from_safetensors(std::string_view name) {
  static constexpr std::array<DType, 9> kAll = {DType::kF32,    DType::kBF16, DType::kF16,
                                                DType::kF8E4M3, DType::kI64,  DType::kI32,
                                                DType::kI8,     DType::kU8,   DType::kBool};
  for (DType dtype : kAll) {
    if (dtype_name(dtype) == name) return dtype;
  }
  fail("unsupported dtype \"{}\"", name);
}

float f16_to_f32(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  uint32_t result;
  std::memcpy(&result, &magnitude, sizeof(result));
  result |= sign;
  float value;
  std::memcpy(&value, &result, sizeof(value));
  return value;
}

uint16_t f32_to_f16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  float magnitude = std::fabs(value);
  if (std::isnan(value)) return static_cast<uint16_t>(sign | 0x7e00u);
  if (magnitude >= 65520.0f) return static_cast<uint16_t>(sign | 0x7c00u);
  if (magnitude < std::ldexp(1.0f, -14)) {
    // Subnormal: quantise to multiples of 2^-24 with round-to-nearest-even.
    float scaled = std::nearbyint(magnitude * std::ldexp(1.0f, 24));
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(scaled));
  }
  int exponent;
  float fraction = std::frexp(magnitude, &exponent);  // magnitude = fraction * 2^exponent
  float mantissa = std::nearbyint((fraction * 2.0f - 1.0f) * 1024.0f);
  if (mantissa >= 1024.0f) {
    mantissa = 0.0f;
    exponent += 1;
  }
  uint32_t biased = static_cast<uint32_t>(exponent - 1 + 15);
  if (biased >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  return static_cast<uint16_t>(sign | (biased << 10) | static_cast<uint32_t>(mantissa));
}

float f8e4m3_to_f32(uint8_t bits) {
  float sign = (bits & 0x80u) ? -1.0f : 1.0f;
  uint32_t exponent = (bits >> 3) & 0xfu;
  uint32_t mantissa = bits & 0x7u;
  if (exponent == 0xf && mantissa == 0x7) return NAN;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);
  return sign * std::ldexp(static_cast<float>(mantissa | 0x8u), static_cast<int>(exponent) - 10);
}

// Round to nearest even, saturating at +-448 (e4m3fn has no infinity; its only NaN code is
// the all-ones magnitude).
uint8_t f32_to_f8e4m3(float value) {
  if (std::isnan(value)) return 0x7f;
  uint8_t sign = std::signbit(value) ? 0x80u : 0u;
  float magnitude = std::fabs(value);
  constexpr float kMinNormal = 0.015625f;  // 2^-6
  constexpr uint8_t kMaxFinite = 0x7e;     // 448
  if (magnitude < kMinNormal) {
    // Subnormals are multiples of 2^-9; code m (0..8) is m * 2^-9, and 8 is the first normal.
    auto steps = static_cast<uint8_t>(std::nearbyint(magnitude * 512.0f));
    return static_cast<uint8_t>(sign | steps);
  }
  uint32_t bits;
  std::memcpy(&bits, &magnitude, sizeof(bits));
  bits += 0x7ffffu + ((bits >> 20) & 1u);  // round the 23-bit mantissa to 3 bits, ties to even
  int exponent = static_cast<int>(bits >> 23) - 127 + 7;
  uint32_t mantissa = (bits >> 20) & 7u;
  if (exponent > 15 || (exponent == 15 && mantissa == 7))
    return static_cast<uint8_t>(sign | kMaxFinite);
  return static_cast<uint8_t>(sign | (static_cast<uint32_t>(exponent) << 3) | mantissa);
}

}  // namespace deepinfer

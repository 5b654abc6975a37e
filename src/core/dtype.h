// Element types and scalar conversions between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace deepinfer {

enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kI64, kI32, kI8, kU8, kBool };

// Bytes per element.
size_t dtype_size(DType dtype);
// Name as safetensors writes it ("F32", "BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType dtype);
// Parses a safetensors dtype name; throws Error naming the unknown dtype.
DType dtype_from_safetensors(std::string_view name);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);
// FP8 e4m3fn (no infinities, 0x7f/0xff are NaN), as in torch.float8_e4m3fn.
float f8e4m3_to_f32(uint8_t bits);
uint8_t f32_to_f8e4m3(float value);

}  // namespace deepinfer

#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace deepinfer {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly between two bf16 values: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16RoundTripsItsValues) {
  for (uint32_t bits = 0; bits < 0x7c00; bits += 7) {
    auto half = static_cast<uint16_t>(bits);
    EXPECT_EQ(f32_to_f16(f16_to_f32(half)), half) << bits;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
}

TEST(DType, Fp8E4m3MatchesTheFormat) {
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7f)));
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;
    auto byte = static_cast<uint8_t>(code);
    EXPECT_EQ(f32_to_f8e4m3(f8e4m3_to_f32(byte)) & 0x7f, byte & 0x7f) << code;
  }
}

// The nearest e4m3 value by exhaustive search, ties to the even code: the definition the fast
// conversion must agree with.
uint8_t nearest_e4m3(float value) {
  uint8_t best = 0;
  float best_error = INFINITY;
  for (uint8_t code = 0; code < 0x7f; ++code) {
    float error = std::fabs(f8e4m3_to_f32(code) - std::fabs(value));
    if (error < best_error || (error == best_error && (code & 1u) == 0)) {
      best_error = error;
      best = code;
    }
  }
  return static_cast<uint8_t>(best | (std::signbit(value) ? 0x80u : 0u));
}

TEST(DType, Fp8RoundingIsNearestEvenAndSaturates) {
  // Every midpoint between neighbouring codes (the ties), points near them, and a sweep.
  std::vector<float> values = {0.0f, -0.0f, 1e-9f, 447.0f, 448.0f, 463.0f, 465.0f, 1e6f, -1e6f};
  for (uint8_t code = 0; code < 0x7e; ++code) {
    float low = f8e4m3_to_f32(code);
    float high = f8e4m3_to_f32(static_cast<uint8_t>(code + 1));
    float middle = 0.5f * (low + high);
    values.insert(values.end(), {middle, std::nextafter(middle, 0.0f), std::nextafter(middle, 1e9f),
                                 -middle, low * 1.01f});
  }
  for (float value = -500.0f; value <= 500.0f; value += 0.0137f) values.push_back(value);
  for (float value : values) {
    if (std::fabs(value) > 448.0f) {
      EXPECT_EQ(f32_to_f8e4m3(value) & 0x7f, 0x7e) << value;
      continue;
    }
    ASSERT_EQ(f32_to_f8e4m3(value), nearest_e4m3(value)) << value;
  }
}

TEST(DType, SafetensorsNames) {
  EXPECT_EQ(dtype_from_safetensors("BF16"), DType::kBF16);
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3"), DType::kF8E4M3);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_THROW(dtype_from_safetensors("Q4_K"), Error);
}

TEST(Tensor, ContiguousViewsAndRows) {
  std::vector<float> data(24);
  Tensor view = Tensor::contiguous(data.data(), DType::kF32, {2, 3, 4});
  EXPECT_EQ(view.numel(), 24);
  EXPECT_EQ(view.strides[0], 12);
  EXPECT_TRUE(view.is_contiguous());
  Tensor second = view.row(1);
  EXPECT_EQ(second.rank, 2);
  EXPECT_EQ(second.as<float>(), data.data() + 12);
  EXPECT_EQ(view.shape_string(), "[2, 3, 4]");
  FloatTensor owned({5, 7});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(owned.data()) % 64, 0u);
  EXPECT_EQ(owned.data()[34], 0.0f);
}

}  // namespace
}  // namespace deepinfer

#include "model/rope.h"

#include <gtest/gtest.h>

#include <cmath>

namespace deepinfer {
namespace {

TEST(Rope, DefaultFrequenciesFollowTheBase) {
  RopeConfig config;
  config.theta = 10000.0;
  RotaryEmbedding rope(config, 8);
  ASSERT_EQ(rope.inverse_frequencies().size(), 4u);
  EXPECT_FLOAT_EQ(rope.inverse_frequencies()[0], 1.0f);
  EXPECT_NEAR(rope.inverse_frequencies()[2], 1.0 / std::pow(10000.0, 0.5), 1e-7);
  int32_t position = 3;
  float cos[4], sin[4];
  rope.compute(&position, 1, cos, sin);
  EXPECT_NEAR(cos[0], std::cos(3.0), 1e-6);
  EXPECT_NEAR(sin[1], std::sin(3.0 * rope.inverse_frequencies()[1]), 1e-6);
}

TEST(Rope, LinearDividesEveryFrequency) {
  RopeConfig config;
  config.type = RopeType::kLinear;
  config.factor = 4.0;
  RotaryEmbedding scaled(config, 16);
  RotaryEmbedding plain(RopeConfig{}, 16);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_FLOAT_EQ(scaled.inverse_frequencies()[i], plain.inverse_frequencies()[i] / 4.0f);
  }
}

TEST(Rope, Llama3KeepsHighFrequenciesAndScalesLowOnes) {
  RopeConfig config;
  config.type = RopeType::kLlama3;
  config.theta = 500000.0;
  config.factor = 8.0;
  config.low_freq_factor = 1.0;
  config.high_freq_factor = 4.0;
  config.original_max_position_embeddings = 8192;
  RotaryEmbedding rope(config, 128);
  RopeConfig plain_config;
  plain_config.theta = 500000.0;
  RotaryEmbedding plain(plain_config, 128);
  EXPECT_FLOAT_EQ(rope.inverse_frequencies()[0], plain.inverse_frequencies()[0]);
  EXPECT_FLOAT_EQ(rope.inverse_frequencies()[63], plain.inverse_frequencies()[63] / 8.0f);
}

TEST(Rope, YarnScalesMagnitudeAndInterpolatesLowFrequencies) {
  RopeConfig config;
  config.type = RopeType::kYarn;
  config.factor = 40.0;
  config.original_max_position_embeddings = 4096;
  config.mscale = 1.0;
  config.mscale_all_dim = 1.0;
  RotaryEmbedding equal_mscales(config, 64);
  EXPECT_FLOAT_EQ(equal_mscales.attention_scaling(), 1.0f);
  config.mscale_all_dim = 0.0;
  RotaryEmbedding derived(config, 64);
  EXPECT_NEAR(derived.attention_scaling(), 0.1 * std::log(40.0) + 1.0, 1e-6);
  RotaryEmbedding plain(RopeConfig{}, 64);
  EXPECT_FLOAT_EQ(derived.inverse_frequencies()[0], plain.inverse_frequencies()[0]);
  EXPECT_NEAR(derived.inverse_frequencies()[31], plain.inverse_frequencies()[31] / 40.0f, 1e-12);
}

TEST(Rope, DynamicRaisesTheBase) {
  RopeConfig config;
  config.type = RopeType::kDynamic;
  config.factor = 2.0;
  config.original_max_position_embeddings = 2048;
  RotaryEmbedding rope(config, 64);
  RotaryEmbedding plain(RopeConfig{}, 64);
  EXPECT_FLOAT_EQ(rope.inverse_frequencies()[0], 1.0f);
  EXPECT_LT(rope.inverse_frequencies()[31], plain.inverse_frequencies()[31]);
}

}  // namespace
}  // namespace deepinfer

// Bounded replay on the CUDA backend: the replay's windows start at its first position and
// the restored full-attention KV is never overwritten, as on the CPU. Exact replay matches the
// GPU's own cold prefill; a one-window replay's error matches the CPU's (a window reaching
// past the replay's start, or restored KV overwritten, would change it).
#include <gtest/gtest.h>

#include "engine/replay_error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_ops.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::fixture_model;

class CudaReplay : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaReplay, MatchesTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  auto cpu = make_cpu_ops();
  auto gpu = cuda::make_cuda_ops(0, MatmulPrecision::kF32);
  auto cpu_model = load_model(fixture_model(GetParam()), LoadMode::kRead, *cpu);
  auto gpu_model = load_model(fixture_model(GetParam()), LoadMode::kRead, *gpu);
  const CausalLM::ReplayBounds bounds = cpu_model->replay_bounds();
  const int block_size = cpu_model->kv_shape(4).block_size;
  const int64_t prefix =
      (bounds.exact + 2 * bounds.window + block_size - 1) / block_size * block_size;
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < prefix + 19; ++i)
    prompt.push_back(static_cast<int32_t>((i * 41 + 7) % cpu_model->config().vocab_size));

  ReplayError exact = measure_replay(*gpu_model, prompt, prefix, bounds.exact, block_size);
  EXPECT_EQ(exact.replay_start, prefix - bounds.exact);
  EXPECT_LT(exact.max_abs_diff, 2e-3);

  const int64_t window = std::max(bounds.window, bounds.least);
  ReplayError on_cpu = measure_replay(*cpu_model, prompt, prefix, window, block_size);
  ReplayError on_gpu = measure_replay(*gpu_model, prompt, prefix, window, block_size);
  EXPECT_EQ(on_gpu.replay_start, on_cpu.replay_start);
  EXPECT_GT(on_cpu.max_abs_diff, 1e-2);
  EXPECT_NEAR(on_gpu.max_abs_diff, on_cpu.max_abs_diff, 0.05 * on_cpu.max_abs_diff + 2e-3);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaReplay,
                         ::testing::Values("qwen3-hybrid-swa", "deepseek-v4-flash-style"),
                         testing::fixture_test_name);

}  // namespace
}  // namespace deepinfer

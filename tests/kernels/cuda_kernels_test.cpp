// Every CUDA kernel against the CPU ops on fresh random inputs. Tolerances (relative L2 norm
// of the difference): f32 elementwise work 1e-6; products with bf16 weights and f32
// activations 1e-5 (only the summation order differs); cuBLASLt, which rounds activations to
// bf16, 1e-2. Skipped, and saying so, where no GPU is present (CI builds it, the H200 runs it).
#include "kernels/cuda/cuda_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "kernels/ops.h"

namespace deepinfer::cuda {
namespace {

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
    cpu_ = make_cpu_ops();
  }
  std::vector<float> random(size_t count, float scale = 1.0f) {
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> values(count);
    for (float& v : values) v = normal(rng_);
    return values;
  }
  static std::vector<uint16_t> to_bf16(const std::vector<float>& values) {
    std::vector<uint16_t> out(values.size());
    for (size_t i = 0; i < values.size(); ++i) out[i] = f32_to_bf16(values[i]);
    return out;
  }
  template <typename T>
  static DeviceBuffer upload(const std::vector<T>& host) {
    DeviceBuffer buffer(host.size() * sizeof(T));
    buffer.upload(host.data(), buffer.bytes());
    return buffer;
  }
  // Output buffers start as NaN so an element nothing wrote fails the comparison.
  static DeviceBuffer poisoned(size_t floats) {
    return upload(std::vector<float>(floats, std::nanf("")));
  }
  static std::vector<float> download(const DeviceBuffer& buffer) {
    std::vector<float> host(buffer.bytes() / sizeof(float));
    buffer.download(host.data(), buffer.bytes());
    return host;
  }
  static double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (!std::isfinite(got[i])) return INFINITY;
      diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
      norm += double(want[i]) * want[i];
    }
    return std::sqrt(diff / norm);
  }

  std::mt19937 rng_{std::random_device{}()};
  std::unique_ptr<Ops> cpu_;
};

TEST_F(CudaKernels, RmsnormSiluMulAddEmbedding) {
  const int64_t rows = 7, n = 4096;
  std::vector<float> x = random(rows * n), weight = random(n), up = random(rows * n);
  std::vector<uint16_t> weight_bf16 = to_bf16(weight);
  Tensor x_host = Tensor::contiguous(x.data(), DType::kF32, {rows, n});
  Tensor w_host = Tensor::contiguous(weight_bf16.data(), DType::kBF16, {n});
  std::vector<float> want(rows * n);
  Tensor want_t = Tensor::contiguous(want.data(), DType::kF32, {rows, n});
  cpu_->rmsnorm(x_host, w_host, 1e-6f, want_t);
  DeviceBuffer dx = upload(x), dw = upload(weight_bf16), dy = poisoned(rows * n);
  rmsnorm(dx.as<float>(), dw.data(), DType::kBF16, rows, n, 1e-6f, dy.as<float>());
  EXPECT_LT(relative_error(download(dy), want), 1e-6);

  Tensor up_host = Tensor::contiguous(up.data(), DType::kF32, {rows, n});
  cpu_->silu_mul(x_host, up_host, want_t);
  DeviceBuffer dup = upload(up), dout = poisoned(rows * n);
  silu_mul(dx.as<float>(), dup.as<float>(), dout.as<float>(), rows * n);
  EXPECT_LT(relative_error(download(dout), want), 1e-6);

  std::vector<float> sum = x;
  Tensor sum_t = Tensor::contiguous(sum.data(), DType::kF32, {rows, n});
  cpu_->add(sum_t, up_host);
  add(dx.as<float>(), dup.as<float>(), rows * n);
  EXPECT_LT(relative_error(download(dx), sum), 1e-6);

  const int64_t vocab = 1000;
  std::vector<uint16_t> table = to_bf16(random(vocab * n));
  std::vector<int32_t> ids = {5, 999, 0, 5, 431, 17, 2};
  cpu_->embedding(Tensor::contiguous(table.data(), DType::kBF16, {vocab, n}), ids.data(), want_t);
  DeviceBuffer dtable = upload(table), dids = upload(ids), demb = poisoned(rows * n);
  embedding(dtable.data(), DType::kBF16, n, dids.as<int32_t>(), rows, demb.as<float>());
  EXPECT_EQ(download(demb), want);  // a copy: exact
}

TEST_F(CudaKernels, RopeBothLayouts) {
  const int64_t tokens = 5;
  const int heads = 4, head_dim = 128;
  for (bool interleaved : {false, true}) {
    for (int rotary_dim : {128, 64}) {
      std::vector<float> x = random(tokens * heads * head_dim);
      std::vector<float> cos = random(tokens * rotary_dim / 2),
                         sin = random(tokens * rotary_dim / 2);
      std::vector<float> want = x;
      Tensor want_t = Tensor::contiguous(want.data(), DType::kF32, {tokens, heads, head_dim});
      cpu_->rope(want_t, cos.data(), sin.data(), rotary_dim, interleaved);
      DeviceBuffer dx = upload(x), dcos = upload(cos), dsin = upload(sin);
      rope(dx.as<float>(), dcos.as<float>(), dsin.as<float>(), tokens, heads, head_dim, rotary_dim,
           interleaved);
      EXPECT_LT(relative_error(download(dx), want), 1e-6) << interleaved << " " << rotary_dim;
    }
  }
}

TEST_F(CudaKernels, Bf16MatmulsMatchTheCpu) {
  const int64_t n = 1536, k = 2048;
  std::vector<uint16_t> weight = to_bf16(random(n * k, 0.05f));
  Tensor w_host = Tensor::contiguous(weight.data(), DType::kBF16, {n, k});
  DeviceBuffer dw = upload(weight);
  LtMatmul lt;
  for (int64_t rows : {1, 3, 8, 37, 256}) {
    std::vector<float> x = random(rows * k);
    std::vector<float> want(rows * n);
    Tensor want_t = Tensor::contiguous(want.data(), DType::kF32, {rows, n});
    cpu_->matmul(Tensor::contiguous(x.data(), DType::kF32, {rows, k}), w_host, nullptr, want_t);
    DeviceBuffer dx = upload(x), dy = poisoned(rows * n);
    if (rows <= 8) {
      matmul_bf16_few_rows(dx.as<float>(), dw.as<uint16_t>(), rows, n, k, dy.as<float>());
      EXPECT_LT(relative_error(download(dy), want), 1e-5) << rows << " rows";
      dy = poisoned(rows * n);
    }
    DeviceBuffer dx_bf16(rows * k * sizeof(uint16_t));
    lt.run(dx.as<float>(), dx_bf16.as<uint16_t>(), dw.as<uint16_t>(), rows, n, k, dy.as<float>());
    synchronize();
    EXPECT_LT(relative_error(download(dy), want), 1e-2) << rows << " rows (cuBLASLt)";
  }
}

}  // namespace
}  // namespace deepinfer::cuda

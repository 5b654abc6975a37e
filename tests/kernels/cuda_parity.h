// The CUDA backend against the CPU backend through the Ops interface: random inputs on both
// backends and the relative error between their results (shared by the CUDA op tests).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"

namespace deepinfer::cuda::testing {

constexpr double kExact = 1e-6;
constexpr double kF32Products = 1e-5;
constexpr double kBf16Activations = 1e-2;
// Products of bf16 weights keep x in f32 up to this many rows (the few-rows kernels); more rows
// go to cuBLASLt with x rounded to bf16.
constexpr int64_t kF32ActivationRows = 3;
inline double bf16_weight_products(int64_t rows) {
  return rows <= kF32ActivationRows ? kF32Products : kBf16Activations;
}
constexpr double kHalfActivations = 1e-2;  // f16 rounds finer than bf16: the same bound holds
// FP8 prompt products quantise x to e4m3 in groups of 128 scaled to their largest value: one
// part in 16 an element, averaged out in the sums (measured ~4e-4).
constexpr double kFp8Activations = 1e-2;

// Host data and its copy in the GPU backend's memory.
struct Both {
  std::vector<std::byte> bytes;
  BackendMemory device;
  Tensor host_view, device_view;
};

class CudaOpsParity : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
    cpu_ = make_cpu_ops();
    gpu_ = make_cuda_ops();
  }

  // A tensor of `dtype` holding `values` (rounded to the dtype) on both backends.
  Both make(const std::vector<float>& values, DType dtype, std::initializer_list<int64_t> shape) {
    Both both;
    both.bytes.resize(values.size() * dtype_size(dtype));
    for (size_t i = 0; i < values.size(); ++i) {
      std::byte* at = both.bytes.data() + i * dtype_size(dtype);
      if (dtype == DType::kF32) {
        std::memcpy(at, &values[i], 4);
      } else if (dtype == DType::kBF16) {
        uint16_t v = f32_to_bf16(values[i]);
        std::memcpy(at, &v, 2);
      } else if (dtype == DType::kF16) {
        uint16_t v = f32_to_f16(values[i]);
        std::memcpy(at, &v, 2);
      } else {
        uint8_t v = f32_to_f8e4m3(values[i]);
        std::memcpy(at, &v, 1);
      }
    }
    both.host_view = Tensor::contiguous(both.bytes.data(), dtype, shape);
    both.device = gpu_->allocate(both.bytes.size());
    gpu_->to_backend(both.device.get(), both.bytes.data(), both.bytes.size());
    both.device_view = Tensor::contiguous(both.device.get(), dtype, shape, Device::kCuda);
    return both;
  }
  Both random(std::initializer_list<int64_t> shape, DType dtype = DType::kF32, float scale = 1.0f) {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> values(static_cast<size_t>(count));
    for (float& v : values) v = normal(rng_);
    return make(values, dtype, shape);
  }
  // Output tensors start as NaN on the GPU so an element nothing wrote fails the comparison.
  Both output(std::initializer_list<int64_t> shape) {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    return make(std::vector<float>(static_cast<size_t>(count), std::nanf("")), DType::kF32, shape);
  }
  std::vector<float> host_floats(const Both& both) const {
    std::vector<float> out(both.bytes.size() / 4);
    std::memcpy(out.data(), both.bytes.data(), both.bytes.size());
    return out;
  }
  std::vector<float> device_floats(const Both& both) const {
    std::vector<float> out(both.bytes.size() / 4);
    gpu_->to_host(out.data(), both.device.get(), both.bytes.size());
    return out;
  }
  // Relative L2 error of the GPU result against the CPU result.
  double error(const Both& both) const {
    std::vector<float> want = host_floats(both), got = device_floats(both);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (!std::isfinite(got[i])) return INFINITY;
      diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
      norm += double(want[i]) * want[i];
    }
    return std::sqrt(diff / std::max(norm, 1e-30));
  }
  // Gives an FP8 weight [n, k] 128 x 128 block scales on both backends.
  void attach_scales(Both& weight, int64_t n, int64_t k) {
    int64_t rows = (n + 127) / 128, cols = (k + 127) / 128;
    std::uniform_real_distribution<float> positive(0.005f, 0.02f);
    std::vector<float> values(static_cast<size_t>(rows * cols));
    for (float& v : values) v = positive(rng_);
    Both& s = scales_.emplace_back(make(values, DType::kF32, {rows, cols}));
    host_blocks_.push_back({s.host_view.as<const float>(), rows, cols, 128, 128});
    device_blocks_.push_back({s.device_view.as<const float>(), rows, cols, 128, 128});
    weight.host_view.block_scales = &host_blocks_.back();
    weight.device_view.block_scales = &device_blocks_.back();
  }

  // A batch of sequences whose blocks are scattered through a 64-block pool, every cached
  // token given a slot (so one kv_write fills each cache), as the CPU and the GPU read it.
  struct PagedBatch {
    std::vector<int32_t> query_start, context_lens, tables;
    std::vector<int64_t> slots;
    AttentionBatch host, device;
    BackendMemory keep[4];
  };
  std::unique_ptr<PagedBatch> paged_batch(std::vector<int32_t> query_start,
                                          std::vector<int32_t> context_lens, int block,
                                          int max_blocks) {
    auto b = std::make_unique<PagedBatch>();
    b->query_start = std::move(query_start);
    b->context_lens = std::move(context_lens);
    auto seqs = static_cast<int>(b->context_lens.size());
    b->tables.resize(static_cast<size_t>(seqs * max_blocks));
    for (size_t i = 0; i < b->tables.size(); ++i)
      b->tables[i] = 1 + static_cast<int32_t>(i * 7 % 60);
    for (int s = 0; s < seqs; ++s) {
      for (int t = 0; t < b->context_lens[static_cast<size_t>(s)]; ++t)
        b->slots.push_back(int64_t{b->tables[static_cast<size_t>(s * max_blocks + t / block)]} *
                               block +
                           t % block);
    }
    int32_t longest = *std::max_element(b->context_lens.begin(), b->context_lens.end());
    b->host = {seqs,
               b->query_start.data(),
               b->context_lens.data(),
               b->tables.data(),
               max_blocks,
               b->slots.data(),
               longest};
    auto on_gpu = [&](const auto& values, BackendMemory& keep) {
      return backend_copy(*gpu_, values.data(), values.size() * sizeof(values[0]), keep);
    };
    b->device = b->host;
    b->device.query_start = static_cast<const int32_t*>(on_gpu(b->query_start, b->keep[0]));
    b->device.context_lens = static_cast<const int32_t*>(on_gpu(b->context_lens, b->keep[1]));
    b->device.block_tables = static_cast<const int32_t*>(on_gpu(b->tables, b->keep[2]));
    b->device.slot_mapping = static_cast<const int64_t*>(on_gpu(b->slots, b->keep[3]));
    return b;
  }

  std::mt19937 rng_{std::random_device{}()};
  std::unique_ptr<Ops> cpu_, gpu_;
  std::deque<Both> scales_;
  std::deque<BlockScales> host_blocks_, device_blocks_;
};

}  // namespace deepinfer::cuda::testing

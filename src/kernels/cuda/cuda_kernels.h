// The CUDA backend's kernels over device memory (the first set of issue 7: the dense
// decoder's ops). Activations are f32 as on the CPU; weights keep their stored dtype. Every
// function checks its launch and throws deepinfer::Error naming the CUDA error. Tested
// against the CPU ops (tests/kernels/cuda_kernels_test.cpp) and timed by bench/cuda_bench.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "kernels/ops.h"

namespace deepinfer::cuda {

// Devices this process can use (0 when there is no driver or no GPU).
int device_count();

// Device memory owned by one object.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Throws Error naming `what` and the last launch's error, if any.
void check_launch(const char* what);
void synchronize();

// y[rows, n] = rmsnorm(x[rows, n]) * weight[n]; y may alias x. weight is f32 or bf16.
void rmsnorm(const float* x, const void* weight, DType weight_dtype, int64_t rows, int64_t n,
             float eps, float* y, cudaStream_t stream = nullptr);
// out = silu(gate) * up, elementwise over `count`; out may alias gate.
void silu_mul(const float* gate, const float* up, float* out, int64_t count,
              cudaStream_t stream = nullptr);
// y += x over `count`.
void add(float* y, const float* x, int64_t count, cudaStream_t stream = nullptr);
// out[i, :] = table[ids[i], :] widened to f32 (table f32 or bf16, `width` columns).
void embedding(const void* table, DType table_dtype, int64_t width, const int32_t* ids,
               int64_t count, float* out, cudaStream_t stream = nullptr);
// Rotates x [tokens, heads, head_dim] in place by cos/sin [tokens, rotary_dim / 2]: pairs
// (i, i + rotary_dim/2), or (2i, 2i+1) when interleaved.
void rope(float* x, const float* cos, const float* sin, int64_t tokens, int heads, int head_dim,
          int rotary_dim, bool interleaved, cudaStream_t stream = nullptr);

// y[t, n] = sum_k x[t, k] * weight[n, k] for a bf16 weight [n, k] and few rows (decode):
// each weight byte is read once for all rows, 16 bytes per load. rows <= 8, k % 8 == 0.
void matmul_bf16_few_rows(const float* x, const uint16_t* weight, int64_t rows, int64_t n,
                          int64_t k, float* y, cudaStream_t stream = nullptr);

// As Ops::kv_write: k [tokens, kv_heads * key_dim] (and v, unless the cache keeps values in
// keys) into the slots slot_mapping names. Every pointer on the device.
void kv_write(const float* k, const float* v, const int64_t* slot_mapping, int64_t tokens,
              const PagedKvView& cache, cudaStream_t stream = nullptr);
// How many contiguous shares of its keys each (row, KV head) of paged_attention is split
// into, for a batch whose longest context is `max_context` (decode of few sequences needs
// many to fill the chip); and the workspace floats that many splits need.
struct SplitKeys {
  int splits = 1;
};
int paged_attention_splits(int64_t rows, int num_kv_heads, int64_t max_context);
size_t paged_attention_workspace_floats(int64_t rows, int num_kv_heads, int splits);

// As Ops::paged_attention over `rows` query rows of `heads` heads: causal, each sequence's
// keys through its block table, optionally windowed. Every pointer in q, batch, cache, out
// and workspace on the device. 128-wide GQA heads (up to 8 per KV head) take a grouped
// kernel that reads each K/V row once per group and, given a workspace, splits the keys
// over several blocks merged after; other shapes one block per (row, head).
void paged_attention(const float* q, int64_t rows, int heads, const AttentionBatch& batch,
                     const PagedKvView& cache, float scale, int window, float* out,
                     cudaStream_t stream = nullptr, SplitKeys split = {},
                     float* workspace = nullptr, size_t workspace_floats = 0);

// The same for a DeepSeek-style FP8 e4m3 weight [n, k] with f32 scales per 128 x 128 block
// ([ceil(n / 128), ceil(k / 128)]): dequantised in registers, never widened in memory.
// rows <= 8, k % 16 == 0.
void matmul_fp8_few_rows(const float* x, const uint8_t* weight, const float* scales, int64_t rows,
                         int64_t n, int64_t k, float* y, cudaStream_t stream = nullptr);

// The same product for any number of rows through cuBLASLt on the tensor cores: x is
// rounded to bf16 (into `x_bf16`, rows * k elements), accumulation is f32, y is f32.
class LtMatmul {
 public:
  LtMatmul();
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;
  void run(const float* x, uint16_t* x_bf16, const uint16_t* weight, int64_t rows, int64_t n,
           int64_t k, float* y, cudaStream_t stream = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::cuda

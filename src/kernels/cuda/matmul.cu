// Products with bf16, f16 and FP8 weights for decode's few rows: bandwidth-bound kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/overlap.cuh"
#include "kernels/cuda/weight_chunks.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kMaxProducts = kMaxFewRowsProducts;

// Up to kMaxProducts products of the same x in one launch (q/k/v, gate/up): their output
// columns laid end to end, each warp finds its product by the cumulative column ends.
template <typename Chunks>
struct Products {
  const uint4* weight[kMaxProducts];
  Chunks format[kMaxProducts];
  float* y[kMaxProducts];
  int64_t n[kMaxProducts];
  int64_t end[kMaxProducts];
  bool accumulate[kMaxProducts];
  int count;
  FewRowsNorm norm;  // weight null: x is read as it is
};

__device__ float norm_scale(const FewRowsNorm& norm, int64_t i) {
  if (norm.dtype == DType::kBF16)
    return __bfloat162float(static_cast<const __nv_bfloat16*>(norm.weight)[i]);
  if (norm.dtype == DType::kF16) return __half2float(static_cast<const __half*>(norm.weight)[i]);
  return static_cast<const float*>(norm.weight)[i];
}

// rmsnorm of the block's staged rows in place, with rmsnorm_kernel's arithmetic.
template <int kRows>
__device__ void normalise_staged(float* x, int64_t k, const FewRowsNorm& norm) {
  __shared__ float partial[kWarpsPerBlock];
  for (int r = 0; r < kRows; ++r) {
    float* row = x + r * k;
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) sum += row[i] * row[i];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < kWarpsPerBlock; ++w) total += partial[w];
    const float scale = rsqrtf(total / static_cast<float>(k) + norm.eps);
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x)
      row[i] = row[i] * scale * norm_scale(norm, i);
    __syncthreads();
  }
}

// The most x (rows * k floats) a block stages in shared memory to normalise it in place.
constexpr size_t kMaxStagedBytes = 64 << 10;

// Several loads in flight per lane before the first is used: a short row is then read in one
// or two round trips to memory instead of one per chunk. Eight for one or two rows (batch-1
// decode, where an 8 KB row is the whole job of a warp), four when the rows' accumulators and
// x loads need the registers.
template <int kRows>
constexpr int kInFlight = kRows <= 2 ? 8 : 4;

// Where one output column's weight row and result live.
template <typename Chunks>
struct Column {
  const uint4* row = nullptr;
  Chunks format{};
  float* y = nullptr;
  int64_t n = 0, index = 0;
  bool accumulate = false;
};

template <typename Chunks>
__device__ Column<Chunks> column_of(const Products<Chunks>& products, int64_t global_column,
                                    int64_t chunks) {
  Column<Chunks> c;
  bool found = false;
  // Compile-time indices only: the parameter arrays stay in the constant bank.
#pragma unroll
  for (int i = 0; i < kMaxProducts; ++i) {
    if (!found && i < products.count && global_column < products.end[i]) {
      c.format = products.format[i];
      c.y = products.y[i];
      c.accumulate = products.accumulate[i];
      c.n = products.n[i];
      c.index = global_column - (products.end[i] - products.n[i]);
      c.row = products.weight[i] + c.index * chunks;
      found = true;
    }
  }
  return c;
}

// One warp's column: lanes stride over k in 16-byte chunks, each weight chunk used for every
// row of x; then a warp reduction. `loaded` holds the first kInFlight chunks if `prefetched`.
template <int kRows, typename Chunks>
__device__ void column_product(const float* x, int64_t k, const Column<Chunks>& c,
                               uint4 (&loaded)[kInFlight<kRows>], bool prefetched) {
  constexpr int kPer = Chunks::kPerChunk;
  constexpr int kLoads = kInFlight<kRows>;
  const int lane = threadIdx.x % 32;
  const int64_t chunks = k / kPer;
  float acc[kRows] = {};
  auto consume = [&](uint4 packed, int64_t chunk) {
    float w[kPer];
    c.format.widen(packed, w);
    const float scale = c.format.scale(c.index, chunk);
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] += chunk_dot<kPer>(w, x + r * k + chunk * kPer) * scale;
  };
  int64_t chunk = lane;
  for (bool first = true; chunk + 32 * (kLoads - 1) < chunks; chunk += 32 * kLoads, first = false) {
    if (!(first && prefetched)) {
#pragma unroll
      for (int i = 0; i < kLoads; ++i) loaded[i] = c.row[chunk + 32 * i];
    }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) consume(loaded[i], chunk + 32 * i);
  }
  for (; chunk < chunks; chunk += 32) consume(c.row[chunk], chunk);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float sum = acc[r];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) c.y[r * c.n + c.index] = c.accumulate ? c.y[r * c.n + c.index] + sum : sum;
  }
}

// A warp per output column. Unstaged: a block per eight columns, x read through L2.
// (Two warps per column, each over half of k, measured slower for every 8B decode shape on
// the H200: q/k/v 63% -> 51% of copy.)
// At most 64 registers a thread, so four blocks fit a multiprocessor: the 8B's o and down
// products (512 blocks) then run in one wave instead of a full one and a sliver.
template <int kRows, typename Chunks>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, 4)
    few_rows_kernel(const float* __restrict__ x, Products<Chunks> products, int64_t k) {
  release_dependents();
  const int64_t global_column = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int64_t chunks = k / Chunks::kPerChunk;
  const bool has_column = global_column < products.end[products.count - 1];
  const Column<Chunks> c = column_of(products, global_column, chunks);
  // The weights are no kernel's output: the first loads go out before the wait for x, while
  // the previous kernel finishes.
  uint4 loaded[kInFlight<kRows>];
  const int lane = threadIdx.x % 32;
  const bool prefetched = has_column && lane + 32 * (kInFlight<kRows> - 1) < chunks;
  if (prefetched) {
#pragma unroll
    for (int i = 0; i < kInFlight<kRows>; ++i) loaded[i] = c.row[lane + 32 * i];
  }
  await_producer();
  if (has_column) column_product<kRows>(x, k, c, loaded, prefetched);
}

// Staged: x (normalised first when the products carry a norm) copied once into the block's
// shared memory; as many blocks as fit on the GPU at once, each then taking every
// gridDim.x-th group of eight columns, so x is staged once per block rather than once per
// eight columns (all blocks staging the same lines at once measured slower than reading x
// through L2 for the 8B's small products). Not held to 64 registers as the plain kernel is:
// four blocks a multiprocessor instead of three spilled and measured slower (batch-1 step
// 5.81 -> 6.30 ms).
template <int kRows, typename Chunks>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    staged_few_rows_kernel(const float* __restrict__ x_global, Products<Chunks> products,
                           int64_t k) {
  release_dependents();
  const int64_t columns = products.end[products.count - 1];
  const int64_t chunks = k / Chunks::kPerChunk;
  int64_t global_column = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  Column<Chunks> c = column_of(products, global_column, chunks);
  uint4 loaded[kInFlight<kRows>];
  const int lane = threadIdx.x % 32;
  const bool prefetched = global_column < columns && lane + 32 * (kInFlight<kRows> - 1) < chunks;
  if (prefetched) {
#pragma unroll
    for (int i = 0; i < kInFlight<kRows>; ++i) loaded[i] = c.row[lane + 32 * i];
  }
  await_producer();
  extern __shared__ float4 staged[];
  const auto* from = reinterpret_cast<const float4*>(x_global);
  for (int64_t i = threadIdx.x; i < kRows * k / 4; i += blockDim.x) staged[i] = from[i];
  __syncthreads();
  if (products.norm.weight)
    normalise_staged<kRows>(reinterpret_cast<float*>(staged), k, products.norm);
  const float* x = reinterpret_cast<const float*>(staged);
  for (bool first = true; global_column < columns;
       global_column += int64_t{gridDim.x} * kWarpsPerBlock, first = false) {
    if (!first) c = column_of(products, global_column, chunks);
    column_product<kRows>(x, k, c, loaded, first && prefetched);
  }
}

// What bounds the staged kernel's resident blocks, found by configure_few_rows_kernels
// (outside any graph capture): multiprocessors, shared memory per multiprocessor, and blocks
// per multiprocessor as registers allow, per row count (bf16, f16 and FP8 alike: the larger).
struct StagedLimits {
  int sms = 0;
  int64_t shared_per_sm = 0;
  int by_registers[9] = {};
};
StagedLimits staged_limits;

template <int kRows, typename Chunks>
void find_register_limit() {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, staged_few_rows_kernel<kRows, Chunks>,
                                                    kWarpsPerBlock * 32, 0) == cudaSuccess)
    staged_limits.by_registers[kRows] = std::max(staged_limits.by_registers[kRows], per_sm);
}

// Blocks of the staged kernel that fit on the GPU at once with `staged_bytes` each (the
// runtime reserves 1 KB of shared memory per block besides).
int64_t resident_blocks(int rows, size_t staged_bytes) {
  const int64_t by_shared =
      staged_limits.shared_per_sm / (static_cast<int64_t>(staged_bytes) + 1024);
  const int64_t per_sm = std::min<int64_t>(by_shared, staged_limits.by_registers[rows]);
  return std::max<int64_t>(1, staged_limits.sms * std::max<int64_t>(1, per_sm));
}

// x is staged when the products normalise it (the norm needs all of x in the block); plain
// products read x through L2, which measured faster for them.
template <int kRows, typename Chunks>
void launch_rows(const float* x, const Products<Chunks>& products, int64_t k, cudaStream_t stream) {
  const int64_t columns = products.end[products.count - 1];
  const int64_t column_blocks = (columns + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (!products.norm.weight) {
    launch_overlapped(few_rows_kernel<kRows, Chunks>, static_cast<unsigned>(column_blocks),
                      kWarpsPerBlock * 32, 0, stream, x, products, k);
    return;
  }
  const size_t staged_bytes = static_cast<size_t>(kRows * k) * sizeof(float);
  const auto blocks =
      static_cast<unsigned>(std::min(column_blocks, resident_blocks(kRows, staged_bytes)));
  launch_overlapped(staged_few_rows_kernel<kRows, Chunks>, blocks, kWarpsPerBlock * 32,
                    staged_bytes, stream, x, products, k);
}

// The row count as a template argument (1 to 8), so the accumulators stay in registers:
// whichever of launch_rows<1> ... launch_rows<8> matches `rows`; false when none does.
template <typename Chunks, int... kMinusOne>
bool launch_row_count(const float* x, const Products<Chunks>& products, int64_t rows, int64_t k,
                      cudaStream_t stream, std::integer_sequence<int, kMinusOne...>) {
  return ((rows == kMinusOne + 1 ? (launch_rows<kMinusOne + 1>(x, products, k, stream), true)
                                 : false) ||
          ...);
}

template <typename Chunks>
void launch_few_rows(const float* x, const Products<Chunks>& products, int64_t rows, int64_t k,
                     cudaStream_t stream, const char* what) {
  if (k % Chunks::kPerChunk != 0)
    fail("{}: k = {} is not a multiple of {}", what, k, Chunks::kPerChunk);
  if (!launch_row_count(x, products, rows, k, stream, std::make_integer_sequence<int, 8>{}))
    fail("{}: {} rows (1 to 8)", what, rows);
  check_launch(what);
}

template <typename Chunks>
Products<Chunks> single_product(const void* weight, Chunks format, int64_t n, float* y) {
  Products<Chunks> products{};
  products.weight[0] = static_cast<const uint4*>(weight);
  products.format[0] = format;
  products.y[0] = y;
  products.n[0] = n;
  products.end[0] = n;
  products.count = 1;
  return products;
}

void check_attribute(cudaError_t status) {
  if (status != cudaSuccess)
    fail("few-rows products: setting up the kernels: {}", cudaGetErrorString(status));
}

}  // namespace

void matmul_bf16_few_rows(const float* x, const uint16_t* weight, int64_t rows, int64_t n,
                          int64_t k, float* y, cudaStream_t stream) {
  launch_few_rows(x, single_product(weight, Bf16Chunks{}, n, y), rows, k, stream,
                  "matmul_bf16_few_rows");
}

namespace {

// The staged kernels may use kMaxStagedBytes of dynamic shared memory (over the 48 KB
// default), for every row count.
template <typename Chunks, int... kMinusOne>
void allow_staged_x(std::integer_sequence<int, kMinusOne...>) {
  (check_attribute(cudaFuncSetAttribute(staged_few_rows_kernel<kMinusOne + 1, Chunks>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kMaxStagedBytes))),
   ...);
  (find_register_limit<kMinusOne + 1, Chunks>(), ...);
}

}  // namespace

void configure_few_rows_kernels() {
  int device = 0, shared = 0;
  check_attribute(cudaGetDevice(&device));
  check_attribute(
      cudaDeviceGetAttribute(&staged_limits.sms, cudaDevAttrMultiProcessorCount, device));
  check_attribute(
      cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  staged_limits.shared_per_sm = shared;
  allow_staged_x<Bf16Chunks>(std::make_integer_sequence<int, 8>{});
  allow_staged_x<F16Chunks>(std::make_integer_sequence<int, 8>{});
  allow_staged_x<Fp8Chunks>(std::make_integer_sequence<int, 8>{});
}

bool few_rows_can_normalise(int64_t rows, int64_t k) {
  return rows >= 1 && rows <= 8 && static_cast<size_t>(rows * k) * sizeof(float) <= kMaxStagedBytes;
}

void matmul_bf16_few_rows(const float* x, const FewRowsProduct* products, int count, int64_t rows,
                          int64_t k, cudaStream_t stream, const FewRowsNorm* norm) {
  if (count < 1 || count > kMaxProducts)
    fail("matmul_bf16_few_rows: {} products (1 to {})", count, kMaxProducts);
  if (norm && !few_rows_can_normalise(rows, k))
    fail("matmul_bf16_few_rows: cannot normalise {} rows of {} inside the products", rows, k);
  Products<Bf16Chunks> batch{};
  int64_t end = 0;
  for (int i = 0; i < count; ++i) {
    batch.weight[i] = reinterpret_cast<const uint4*>(products[i].weight);
    batch.y[i] = products[i].y;
    batch.n[i] = products[i].n;
    batch.end[i] = end += products[i].n;
    batch.accumulate[i] = products[i].accumulate;
  }
  batch.count = count;
  if (norm) batch.norm = *norm;
  launch_few_rows(x, batch, rows, k, stream, "matmul_bf16_few_rows");
}

void matmul_f16_few_rows(const float* x, const uint16_t* weight, int64_t rows, int64_t n, int64_t k,
                         float* y, cudaStream_t stream) {
  launch_few_rows(x, single_product(weight, F16Chunks{}, n, y), rows, k, stream,
                  "matmul_f16_few_rows");
}

void matmul_fp8_few_rows(const float* x, const uint8_t* weight, const float* scales, int64_t rows,
                         int64_t n, int64_t k, float* y, cudaStream_t stream) {
  Fp8Chunks format{scales, (k + kScaleBlock - 1) / kScaleBlock};
  launch_few_rows(x, single_product(weight, format, n, y), rows, k, stream, "matmul_fp8_few_rows");
}

}  // namespace deepinfer::cuda

// Products with bf16, f16 and FP8 weights for decode's few rows: bandwidth-bound kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kv_elements.cuh"
#include "kernels/cuda/overlap.cuh"
#include "kernels/cuda/qkv_pairs.h"
#include "kernels/cuda/rope_turn.cuh"
#include "kernels/cuda/row_stream.cuh"
#include "kernels/cuda/row_stream_settings.h"
#include "kernels/cuda/staged_norm.cuh"
#include "kernels/cuda/weight_chunks.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
static_assert(kWarpsPerBlock == kNormWarps, "staged kernels normalise with all their threads");
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

// The most x (rows * k floats) a block stages in shared memory to normalise it in place, and
// the most shared memory a staged block takes: that x and its norm's weights (k <= 16384
// then, so the f32 weights of the widest row take as much again).
constexpr size_t kMaxStagedBytes = 64 << 10;
constexpr size_t kMaxStagedShared = 2 * kMaxStagedBytes;

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

// The sums of one warp's kColumns columns (global indices `columns`), in every lane: lanes
// stride over k in 16-byte chunks, each weight chunk used for every row of x and each load
// of x for every column; then a warp reduction per column and row. `loaded` holds the first
// kInFlight chunks (kInFlight / kColumns of each column) if `prefetched`. A lane adds its
// chunks (those of its residue mod 32) in order whatever kColumns is, so every variant gives
// the same bits. Only the weight rows and formats stay live through the loop.
template <int kRows, int kColumns, typename Chunks>
__device__ void column_sums(const float* x, int64_t k, const Products<Chunks>& products,
                            const int64_t (&columns)[kColumns], uint4 (&loaded)[kInFlight<kRows>],
                            bool prefetched, float (&sums)[kColumns][kRows]) {
  constexpr int kPer = Chunks::kPerChunk;
  constexpr int kLoads = kInFlight<kRows> / kColumns;  // per column
  const int lane = threadIdx.x % 32;
  const int64_t chunks = k / kPer;
  const uint4* rows[kColumns];
  Chunks formats[kColumns];
  int64_t indices[kColumns];
#pragma unroll
  for (int j = 0; j < kColumns; ++j) {
    const Column<Chunks> c = column_of(products, columns[j], chunks);
    rows[j] = c.row;
    formats[j] = c.format;
    indices[j] = c.index;
  }
  float acc[kColumns][kRows] = {};
  auto consume = [&](const uint4(&packed)[kColumns], int64_t chunk) {
#pragma unroll
    for (int j = 0; j < kColumns; ++j)
      add_chunk<kRows>(formats[j], packed[j], indices[j], chunk, x, k, acc[j]);
  };
  int64_t chunk = lane;
  for (bool first = true; chunk + 32 * (kLoads - 1) < chunks; chunk += 32 * kLoads, first = false) {
    if (!(first && prefetched)) {
#pragma unroll
      for (int j = 0; j < kColumns; ++j)
#pragma unroll
        for (int i = 0; i < kLoads; ++i) loaded[j * kLoads + i] = rows[j][chunk + 32 * i];
    }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      uint4 packed[kColumns];
#pragma unroll
      for (int j = 0; j < kColumns; ++j) packed[j] = loaded[j * kLoads + i];
      consume(packed, chunk + 32 * i);
    }
  }
  for (; chunk < chunks; chunk += 32) {
    uint4 packed[kColumns];
#pragma unroll
    for (int j = 0; j < kColumns; ++j) packed[j] = rows[j][chunk];
    consume(packed, chunk);
  }
  add_across_warp(acc, sums);
}

// column_sums, each written to (or added into) its column's output by lane 0; where it goes
// is looked up after the loop (the registers are the kernels' limit).
template <int kRows, int kColumns, typename Chunks>
__device__ void columns_product(const float* x, int64_t k, const Products<Chunks>& products,
                                const int64_t (&columns)[kColumns], const bool (&wanted)[kColumns],
                                uint4 (&loaded)[kInFlight<kRows>], bool prefetched) {
  float sums[kColumns][kRows];
  column_sums<kRows>(x, k, products, columns, loaded, prefetched, sums);
  if (threadIdx.x % 32 != 0) return;
  const int64_t chunks = k / Chunks::kPerChunk;
#pragma unroll
  for (int j = 0; j < kColumns; ++j) {
    const Column<Chunks> c = column_of(products, columns[j], chunks);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (wanted[j])
        c.y[r * c.n + c.index] = c.accumulate ? c.y[r * c.n + c.index] + sums[j][r] : sums[j][r];
    }
  }
}

// The first kInFlight chunks of the columns' rows, each lane its own (issued before the wait
// for the previous kernel: the weights are no kernel's output).
template <int kRows, int kColumns, typename Chunks>
__device__ bool load_first_chunks(const Products<Chunks>& products,
                                  const int64_t (&columns)[kColumns], int64_t chunks,
                                  uint4 (&loaded)[kInFlight<kRows>]) {
  constexpr int kLoads = kInFlight<kRows> / kColumns;
  const int lane = threadIdx.x % 32;
  if (lane + 32 * (kLoads - 1) >= chunks) return false;
#pragma unroll
  for (int j = 0; j < kColumns; ++j) {
    const uint4* row = column_of(products, columns[j], chunks).row;
#pragma unroll
    for (int i = 0; i < kLoads; ++i) loaded[j * kLoads + i] = row[lane + 32 * i];
  }
  return true;
}

// One column per warp, unstaged: a block per eight columns, x read through L2.
// (Two warps per column, each over half of k, measured slower for every 8B decode shape on
// the H200: q/k/v 63% -> 51% of copy; so did two adjacent columns per warp, x loaded once for
// both: batch-1 step 5.39 -> 5.82 ms.)
// At most 64 registers a thread, so four blocks fit a multiprocessor: the 8B's o and down
// products (512 blocks) then run in one wave instead of a full one and a sliver.
template <int kRows, typename Chunks>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, 4)
    few_rows_kernel(const float* __restrict__ x, Products<Chunks> products, int64_t k) {
  release_dependents();
  const int64_t column = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int64_t chunks = k / Chunks::kPerChunk, total = products.end[products.count - 1];
  if (column >= total) return;
  const int64_t columns[1] = {column};
  const bool wanted[1] = {true};
  uint4 loaded[kInFlight<kRows>];
  const bool prefetched = load_first_chunks<kRows>(products, columns, chunks, loaded);
  await_producer();
  columns_product<kRows, 1>(x, k, products, columns, wanted, loaded, prefetched);
}

// The block's dynamic shared memory: x [kRows, k], then the norm's weights.
template <int kRows>
__device__ float* staged_area() {
  extern __shared__ float4 staged[];
  return reinterpret_cast<float*>(staged);
}
size_t staged_shared_bytes(int rows, int64_t k, const FewRowsNorm& norm) {
  return static_cast<size_t>(rows * k) * sizeof(float) + norm_weight_bytes(norm, k);
}

// The norm's weights on their way into the block's shared memory (before the wait for the
// previous kernel): where stage_x then reads them.
template <int kRows>
__device__ const void* prefetch_staged_norm(int64_t k, const FewRowsNorm& norm) {
  return prefetch_norm_weights(norm, k, staged_area<kRows>() + kRows * k, blockDim.x);
}

// x [kRows, k] copied into the block's shared memory and normalised there when `norm` has a
// weight (read from `norm_weights`, prefetch_staged_norm's answer); every thread of the block
// takes part.
template <int kRows>
__device__ const float* stage_x(const float* x_global, int64_t k, const FewRowsNorm& norm,
                                const void* norm_weights) {
  float* staged = staged_area<kRows>();
  const auto* from = reinterpret_cast<const float4*>(x_global);
  auto* to = reinterpret_cast<float4*>(staged);
  for (int64_t i = threadIdx.x; i < kRows * k / 4; i += blockDim.x) to[i] = from[i];
  await_norm_weights();
  __syncthreads();
  if (norm.weight) normalise_staged<kRows>(staged, k, norm, norm_weights, [] { __syncthreads(); });
  return staged;
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
  const int64_t total = products.end[products.count - 1];
  const int64_t chunks = k / Chunks::kPerChunk;
  int64_t column[1] = {blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32};
  uint4 loaded[kInFlight<kRows>];
  const bool prefetched =
      column[0] < total && load_first_chunks<kRows>(products, column, chunks, loaded);
  const void* norm_weights = prefetch_staged_norm<kRows>(k, products.norm);
  await_producer();
  const float* x = stage_x<kRows>(x_global, k, products.norm, norm_weights);
  const bool wanted[1] = {true};
  for (bool first = true; column[0] < total;
       column[0] += int64_t{gridDim.x} * kWarpsPerBlock, first = false)
    columns_product<kRows, 1>(x, k, products, column, wanted, loaded, first && prefetched);
}

// The gated MLP's first half at decode, staged like the kernel above: warp pair j takes gate
// row j (product 0) and up row j (product 1) of the normalised x and writes silu(g) * u,
// with silu_mul_kernel's arithmetic, to product 0's output: one launch and no silu kernel.
template <int kRows>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gated_few_rows_kernel(const float* __restrict__ x_global, Products<Bf16Chunks> products,
                          int64_t k) {
  release_dependents();
  const int64_t n = products.n[0], chunks = k / Bf16Chunks::kPerChunk;
  int64_t pair = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  uint4 loaded[kInFlight<kRows>];
  int64_t columns[2] = {pair, pair + n};
  const bool prefetched = pair < n && load_first_chunks<kRows>(products, columns, chunks, loaded);
  const void* norm_weights = prefetch_staged_norm<kRows>(k, products.norm);
  await_producer();
  const float* x = stage_x<kRows>(x_global, k, products.norm, norm_weights);
  for (bool first = true; pair < n; pair += int64_t{gridDim.x} * kWarpsPerBlock, first = false) {
    columns[0] = pair;
    columns[1] = pair + n;
    float sums[2][kRows];
    column_sums<kRows>(x, k, products, columns, loaded, first && prefetched, sums);
    if (threadIdx.x % 32 != 0) continue;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float gate = sums[0][r];
      products.y[0][r * n + pair] = gate / (1.0f + expf(-gate)) * sums[1][r];
    }
  }
}

// Where the q/k/v products' rotated and cached outputs go: rope_kv_write's contract.
struct RopeWrite {
  const float* cos;  // [rows, rotary_dim / 2]
  const float* sin;
  const int64_t* slot_mapping;
  PagedKvView cache;
  QkvShape shape;
};

// One column's finished value for row r: into its product's output and, for k and v, into
// the token's cache slot.
template <typename T>
__device__ void store_qkv(const Products<Bf16Chunks>& products, const RopeWrite& rope,
                          int64_t column, int r, float value) {
  const int64_t q_columns = rope.shape.q_columns(), kv_columns = rope.shape.kv_columns();
  const int product = column < q_columns ? 0 : column < q_columns + kv_columns ? 1 : 2;
  const int64_t index = column - (product == 0   ? 0
                                  : product == 1 ? q_columns
                                                 : q_columns + kv_columns);
  products.y[product][r * products.n[product] + index] = value;
  if (product == 0 || rope.slot_mapping[r] < 0) return;  // < 0: restored KV a replay keeps
  T* base = static_cast<T*>(product == 1 ? rope.cache.keys : rope.cache.values);
  store_kv(base, rope.slot_mapping[r] * kv_columns + index, value);
}

// Row r's finished pair: rotated as rope_kv_write rotates (when rope turns it), then stored.
template <typename T>
__device__ void turn_and_store(const Products<Bf16Chunks>& products, const RopeWrite& rope,
                               const ColumnPair& p, int r, float x0, float x1) {
  if (p.rotated) {
    const int64_t at = int64_t{r} * (rope.shape.rotary_dim / 2) + p.rope_index;
    const Turned turned = rope_turn(x0, x1, rope.cos[at], rope.sin[at]);
    x0 = turned.first;
    x1 = turned.second;
  }
  store_qkv<T>(products, rope, p.first, r, x0);
  store_qkv<T>(products, rope, p.second, r, x1);
}

// The attention block's input half at decode in one launch, staged like the kernels above:
// q, k and v of the normalised x, q and k rotated as rope_kv_write rotates them (the same
// arithmetic) and k and v stored into the cache. Each warp takes a pair of columns
// (column_pair), so the rotation needs no exchange between warps.
// Held to three blocks a multiprocessor up to four rows (the staged q/k/v product's
// occupancy; unbounded it took 98 registers at one row, two blocks); two beyond, where the
// cap spilled.
template <int kRows, typename T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kRows <= 4 ? 3 : 2)
    qkv_rope_few_rows_kernel(const float* __restrict__ x_global, Products<Bf16Chunks> products,
                             int64_t k, RopeWrite rope) {
  release_dependents();
  const int64_t pairs = rope.shape.pairs(), chunks = k / Bf16Chunks::kPerChunk;
  int64_t pair = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  uint4 loaded[kInFlight<kRows>];
  ColumnPair p = column_pair(pair, rope.shape);
  int64_t columns[2] = {p.first, p.second};
  const bool prefetched =
      pair < pairs && load_first_chunks<kRows>(products, columns, chunks, loaded);
  const void* norm_weights = prefetch_staged_norm<kRows>(k, products.norm);
  await_producer();
  const float* x = stage_x<kRows>(x_global, k, products.norm, norm_weights);
  for (bool first = true; pair < pairs;
       pair += int64_t{gridDim.x} * kWarpsPerBlock, first = false) {
    p = column_pair(pair, rope.shape);
    columns[0] = p.first;
    columns[1] = p.second;
    float sums[2][kRows];
    column_sums<kRows>(x, k, products, columns, loaded, first && prefetched, sums);
    if (threadIdx.x % 32 != 0) continue;
#pragma unroll
    for (int r = 0; r < kRows; ++r) turn_and_store<T>(products, rope, p, r, sums[0][r], sums[1][r]);
  }
}

// The same job for the row stream: pair p is column_pair(p)'s two columns, whose weight rows
// lie apart (one copy each).
template <typename T>
struct QkvRopeJobs {
  static constexpr int kColumns = 2;
  static constexpr bool kAdjacentRows = false;
  Bf16Chunks format;
  FewRowsNorm norm;
  int64_t count;  // column pairs
  Products<Bf16Chunks> products;
  RopeWrite rope;
  int64_t chunks;
  __device__ const uint4* row(int64_t job, int j) const {
    const ColumnPair p = column_pair(job, rope.shape);
    return column_of(products, j ? p.second : p.first, chunks).row;
  }
  __device__ int64_t column(int64_t, int) const { return 0; }  // bf16: no scales
  __device__ void store(int64_t job, int r, const float (&sums)[2]) const {
    turn_and_store<T>(products, rope, column_pair(job, rope.shape), r, sums[0], sums[1]);
  }
};

// What bounds the staged kernel's resident blocks, found by configure_few_rows_kernels
// (outside any graph capture): multiprocessors, shared memory per multiprocessor, and blocks
// per multiprocessor as registers allow, per row count (bf16, f16 and FP8 alike: the larger).
struct StagedLimits {
  int sms = 0;
  int64_t shared_per_sm = 0;
  int by_registers[9] = {}, gated_by_registers[9] = {}, qkv_rope_by_registers[9] = {};
  int64_t shared_per_block = 0;  // the opt-in maximum
  int64_t stream_shared = 0;     // dynamic shared memory every row-stream kernel may take
};
StagedLimits staged_limits;

void check_attribute(cudaError_t status) {
  if (status != cudaSuccess)
    fail("few-rows products: setting up the kernels: {}", cudaGetErrorString(status));
}

// Lets a staged kernel use kMaxStagedShared of dynamic shared memory (over the 48 KB default)
// and returns how many of its blocks fit a multiprocessor as its registers allow (0 if the
// runtime cannot say).
template <typename Kernel>
int allow_staged(Kernel kernel) {
  check_attribute(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kMaxStagedShared)));
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarpsPerBlock * 32, 0) !=
      cudaSuccess)
    return 0;
  return per_sm;
}

// Blocks of a staged kernel (`by_registers` of them a multiprocessor) that fit on the GPU at
// once with `staged_bytes` each (the runtime reserves 1 KB of shared memory per block besides).
int64_t resident_blocks(int by_registers, size_t staged_bytes) {
  const int64_t by_shared =
      staged_limits.shared_per_sm / (static_cast<int64_t>(staged_bytes) + 1024);
  const int64_t per_sm = std::min<int64_t>(by_shared, by_registers);
  return std::max<int64_t>(1, staged_limits.sms * std::max<int64_t>(1, per_sm));
}

// The grid of a staged kernel over `groups` warp jobs: a block per eight while they fit on
// the GPU at once, else as many blocks as fit (each then strides over the jobs).
unsigned staged_grid(int64_t groups, int by_registers, size_t staged_bytes) {
  const int64_t group_blocks = (groups + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(std::min(group_blocks, resident_blocks(by_registers, staged_bytes)));
}

// The ring for `rows` of x [rows, k] (and its norm's weights) in the shared memory a row-stream
// kernel may take.
bool choose_stream_ring(int rows, int64_t k, const FewRowsNorm& norm, int64_t job_bytes,
                        StreamRing& ring) {
  const int64_t room =
      staged_limits.stream_shared - static_cast<int64_t>(stream_staging_bytes(rows, k, norm));
  return choose_ring(room, job_bytes, ring);
}

// `jobs` (for one or two rows of x) through the row stream when `use` is turned on and a
// ring fits; false (nothing launched) otherwise.
template <int kRows, typename Jobs>
bool launch_streamed(const float* x, const Jobs& jobs, int64_t k, StreamUse use,
                     cudaStream_t stream) {
  if constexpr (kRows > 2) {
    return false;
  } else {
    const int64_t job_bytes =
        k / decltype(jobs.format)::kPerChunk * int64_t{sizeof(uint4)} * Jobs::kColumns;
    StreamRing ring{};
    if ((row_stream_setting() & use) == 0 ||
        !choose_stream_ring(kRows, k, jobs.norm, job_bytes, ring))
      return false;
    const int64_t groups = (jobs.count + ring.jobs_per_stage - 1) / ring.jobs_per_stage;
    const size_t shared = stream_staging_bytes(kRows, k, jobs.norm) +
                          static_cast<size_t>(ring.stages * ring.jobs_per_stage * job_bytes);
    launch_overlapped(streamed_rows_kernel<kRows, Jobs>,
                      static_cast<unsigned>(std::min<int64_t>(groups, staged_limits.sms)),
                      (kStreamReaderWarps + 1) * 32, shared, stream, x, jobs, k, ring);
    return true;
  }
}

// The first product of `products` (with their norm) as row-stream jobs.
template <typename Chunks>
PlainJobs<Chunks> plain_jobs(const Products<Chunks>& products, int64_t k) {
  return {products.format[0],    products.norm, products.n[0],         products.weight[0],
          k / Chunks::kPerChunk, products.y[0], products.accumulate[0]};
}

// x is staged when the products normalise it (the norm needs all of x in the block); plain
// products read x through L2, which measured faster for them.
template <int kRows, typename Chunks>
void launch_rows(const float* x, const Products<Chunks>& products, int64_t k, cudaStream_t stream) {
  const int64_t columns = products.end[products.count - 1];
  const int64_t column_blocks = (columns + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (products.count == 1 &&
      launch_streamed<kRows>(x, plain_jobs(products, k), k,
                             products.norm.weight ? kStreamNormalised : kStreamPlain, stream))
    return;
  if (!products.norm.weight) {
    launch_overlapped(few_rows_kernel<kRows, Chunks>, static_cast<unsigned>(column_blocks),
                      kWarpsPerBlock * 32, 0, stream, x, products, k);
    return;
  }
  const size_t staged_bytes = staged_shared_bytes(kRows, k, products.norm);
  launch_overlapped(staged_few_rows_kernel<kRows, Chunks>,
                    staged_grid(columns, staged_limits.by_registers[kRows], staged_bytes),
                    kWarpsPerBlock * 32, staged_bytes, stream, x, products, k);
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

}  // namespace

void matmul_bf16_few_rows(const float* x, const uint16_t* weight, int64_t rows, int64_t n,
                          int64_t k, float* y, cudaStream_t stream) {
  launch_few_rows(x, single_product(weight, Bf16Chunks{}, n, y), rows, k, stream,
                  "matmul_bf16_few_rows");
}

namespace {

// Lets a row-stream kernel take all the dynamic shared memory a block can opt into beside
// its static shared memory, and keeps the least such room over the kernels as the rings'
// budget.
template <typename Kernel>
void allow_streamed(Kernel kernel) {
  cudaFuncAttributes attributes{};
  check_attribute(cudaFuncGetAttributes(&attributes, kernel));
  const int64_t room =
      staged_limits.shared_per_block - static_cast<int64_t>(attributes.sharedSizeBytes);
  check_attribute(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(room)));
  staged_limits.stream_shared =
      staged_limits.stream_shared == 0 ? room : std::min(staged_limits.stream_shared, room);
}

template <typename Chunks>
void configure_streamed_kernels() {
  allow_streamed(streamed_rows_kernel<1, PlainJobs<Chunks>>);
  allow_streamed(streamed_rows_kernel<2, PlainJobs<Chunks>>);
}

// Every row count's staged kernel (bf16, f16 and FP8 alike: the most blocks of the three).
template <typename Chunks, int... kMinusOne>
void configure_staged_kernels(std::integer_sequence<int, kMinusOne...>) {
  ((staged_limits.by_registers[kMinusOne + 1] =
        std::max(staged_limits.by_registers[kMinusOne + 1],
                 allow_staged(staged_few_rows_kernel<kMinusOne + 1, Chunks>))),
   ...);
}

template <int... kMinusOne>
void configure_gated_kernels(std::integer_sequence<int, kMinusOne...>) {
  ((staged_limits.gated_by_registers[kMinusOne + 1] =
        allow_staged(gated_few_rows_kernel<kMinusOne + 1>)),
   ...);
}

// The fewer of two blocks-a-multiprocessor counts, a 0 (the runtime could not say) counting
// as unknown rather than as fewest.
int fewer_known(int a, int b) {
  return a == 0 ? b : b == 0 ? a : std::min(a, b);
}

// Both cache types' kernels; the fewer resident blocks of the two.
template <int... kMinusOne>
void configure_qkv_rope_kernels(std::integer_sequence<int, kMinusOne...>) {
  ((staged_limits.qkv_rope_by_registers[kMinusOne + 1] =
        fewer_known(allow_staged(qkv_rope_few_rows_kernel<kMinusOne + 1, float>),
                    allow_staged(qkv_rope_few_rows_kernel<kMinusOne + 1, __nv_bfloat16>))),
   ...);
}

template <int kRows>
void launch_qkv_rope(const float* x, const Products<Bf16Chunks>& products, int64_t k,
                     const RopeWrite& rope, cudaStream_t stream) {
  const int64_t chunks = k / Bf16Chunks::kPerChunk;
  if (rope.cache.dtype == DType::kBF16
          ? launch_streamed<kRows>(
                x,
                QkvRopeJobs<__nv_bfloat16>{Bf16Chunks{}, products.norm, rope.shape.pairs(),
                                           products, rope, chunks},
                k, kStreamQkvRope, stream)
          : launch_streamed<kRows>(x,
                                   QkvRopeJobs<float>{Bf16Chunks{}, products.norm,
                                                      rope.shape.pairs(), products, rope, chunks},
                                   k, kStreamQkvRope, stream))
    return;
  const size_t staged_bytes = staged_shared_bytes(kRows, k, products.norm);
  const unsigned blocks =
      staged_grid(rope.shape.pairs(), staged_limits.qkv_rope_by_registers[kRows], staged_bytes);
  if (rope.cache.dtype == DType::kBF16) {
    launch_overlapped(qkv_rope_few_rows_kernel<kRows, __nv_bfloat16>, blocks, kWarpsPerBlock * 32,
                      staged_bytes, stream, x, products, k, rope);
  } else {
    launch_overlapped(qkv_rope_few_rows_kernel<kRows, float>, blocks, kWarpsPerBlock * 32,
                      staged_bytes, stream, x, products, k, rope);
  }
}
template <int... kMinusOne>
void launch_qkv_rope_rows(const float* x, const Products<Bf16Chunks>& products, int64_t rows,
                          int64_t k, const RopeWrite& rope, cudaStream_t stream,
                          std::integer_sequence<int, kMinusOne...>) {
  ((rows == kMinusOne + 1 ? (launch_qkv_rope<kMinusOne + 1>(x, products, k, rope, stream), 0) : 0),
   ...);
}

template <int kRows>
void launch_gated(const float* x, const Products<Bf16Chunks>& products, int64_t k,
                  cudaStream_t stream) {
  const GatedJobs gated{products.format[0], products.norm,      products.n[0],
                        products.weight[0], products.weight[1], k / Bf16Chunks::kPerChunk,
                        products.y[0]};
  if (launch_streamed<kRows>(x, gated, k, kStreamGated, stream)) return;
  const size_t staged_bytes = staged_shared_bytes(kRows, k, products.norm);
  launch_overlapped(
      gated_few_rows_kernel<kRows>,
      staged_grid(products.n[0], staged_limits.gated_by_registers[kRows], staged_bytes),
      kWarpsPerBlock * 32, staged_bytes, stream, x, products, k);
}
template <int... kMinusOne>
bool launch_gated_rows(const float* x, const Products<Bf16Chunks>& products, int64_t rows,
                       int64_t k, cudaStream_t stream, std::integer_sequence<int, kMinusOne...>) {
  return ((rows == kMinusOne + 1 ? (launch_gated<kMinusOne + 1>(x, products, k, stream), true)
                                 : false) ||
          ...);
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
  check_attribute(cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  staged_limits.shared_per_block = shared;
  configure_streamed_kernels<Bf16Chunks>();
  configure_streamed_kernels<F16Chunks>();
  configure_streamed_kernels<Fp8Chunks>();
  allow_streamed(streamed_rows_kernel<1, GatedJobs>);
  allow_streamed(streamed_rows_kernel<2, GatedJobs>);
  allow_streamed(streamed_rows_kernel<1, QkvRopeJobs<float>>);
  allow_streamed(streamed_rows_kernel<2, QkvRopeJobs<float>>);
  allow_streamed(streamed_rows_kernel<1, QkvRopeJobs<__nv_bfloat16>>);
  allow_streamed(streamed_rows_kernel<2, QkvRopeJobs<__nv_bfloat16>>);
  configure_staged_kernels<Bf16Chunks>(std::make_integer_sequence<int, 8>{});
  configure_staged_kernels<F16Chunks>(std::make_integer_sequence<int, 8>{});
  configure_staged_kernels<Fp8Chunks>(std::make_integer_sequence<int, 8>{});
  configure_gated_kernels(std::make_integer_sequence<int, 8>{});
  configure_qkv_rope_kernels(std::make_integer_sequence<int, 8>{});
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

void matmul_bf16_few_rows_silu_gate(const float* x, const uint16_t* gate, const uint16_t* up,
                                    int64_t rows, int64_t n, int64_t k, float* act,
                                    const FewRowsNorm& norm, cudaStream_t stream) {
  if (norm.weight == nullptr || !few_rows_can_normalise(rows, k) || k % 8 != 0)
    fail(
        "matmul_bf16_few_rows_silu_gate: {} rows of {} (1 to 8 rows, a norm, x fitting a "
        "block's shared memory, k a multiple of 8)",
        rows, k);
  Products<Bf16Chunks> products{};
  products.weight[0] = reinterpret_cast<const uint4*>(gate);
  products.weight[1] = reinterpret_cast<const uint4*>(up);
  products.y[0] = act;
  products.n[0] = products.n[1] = n;
  products.end[0] = n;
  products.end[1] = 2 * n;
  products.count = 2;
  products.norm = norm;
  launch_gated_rows(x, products, rows, k, stream, std::make_integer_sequence<int, 8>{});
  check_launch("matmul_bf16_few_rows_silu_gate");
}

void matmul_bf16_few_rows_qkv_rope(const float* x, int64_t rows, int64_t k, const QkvRope& job,
                                   const FewRowsNorm& norm, cudaStream_t stream) {
  const PagedKvView& cache = job.cache;
  const int head_dim = cache.key_dim;
  if (norm.weight == nullptr || !few_rows_can_normalise(rows, k) || k % 8 != 0 ||
      cache.values_in_keys || cache.value_dim != head_dim || head_dim % 2 != 0 ||
      job.rotary_dim % 2 != 0 || job.rotary_dim > head_dim || (head_dim - job.rotary_dim) % 2 != 0)
    fail(
        "matmul_bf16_few_rows_qkv_rope: {} rows of {}, head size {}, rotary {} (1 to 8 rows, a "
        "norm, x fitting a block's shared memory, separate keys and values of one even size, "
        "an even rotary part)",
        rows, k, head_dim, job.rotary_dim);
  Products<Bf16Chunks> products{};
  const uint16_t* weights[3] = {job.q_weight, job.k_weight, job.v_weight};
  float* outputs[3] = {job.q, job.k, job.v};
  const int64_t widths[3] = {int64_t{job.heads} * head_dim, int64_t{cache.num_kv_heads} * head_dim,
                             int64_t{cache.num_kv_heads} * head_dim};
  int64_t end = 0;
  for (int i = 0; i < 3; ++i) {
    products.weight[i] = reinterpret_cast<const uint4*>(weights[i]);
    products.y[i] = outputs[i];
    products.n[i] = widths[i];
    products.end[i] = end += widths[i];
  }
  products.count = 3;
  products.norm = norm;
  const RopeWrite rope{job.cos, job.sin, job.slot_mapping, cache,
                       QkvShape{job.heads, cache.num_kv_heads, head_dim, job.rotary_dim}};
  launch_qkv_rope_rows(x, products, rows, k, rope, stream, std::make_integer_sequence<int, 8>{});
  check_launch("matmul_bf16_few_rows_qkv_rope");
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

// The CUDA backend's kernels over device memory. Activations are f32 as on the CPU; weights keep
// their stored dtype. Every function checks its launch and throws deepinfer::Error naming the CUDA
// error. Tested against the CPU ops (tests/kernels/cuda_kernels_test.cpp) and timed by
// bench/cuda_bench.
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
// Throws Error naming `what` when a CUDA runtime call failed.
void check_cuda(cudaError_t status, const char* what);
void synchronize();
// Whether kernels that may overlap their predecessor (programmatic dependent launch, see
// overlap.cuh) are launched that way; DEEPINFER_CUDA_OVERLAP=0 turns it off.
bool overlap_launches();

// y[rows, n] = rmsnorm(x[rows, n]) * weight[n]; y may alias x. weight is f32, bf16 or f16.
// Rows start `x_stride` / `y_stride` floats apart (a slice of wider rows, as MLA's latents).
void rmsnorm(const float* x, int64_t x_stride, const void* weight, DType weight_dtype, int64_t rows,
             int64_t n, float eps, float* y, int64_t y_stride, cudaStream_t stream = nullptr);
// out = silu(gate) * up, elementwise over `count`; out may alias gate.
// out = silu(min(gate, limit)) * clamp(up, -limit, limit) (DeepSeek-V4's SwiGLU).
void clamped_silu_mul(const float* gate, const float* up, float limit, float* out, int64_t count,
                      cudaStream_t stream = nullptr);
void silu_mul(const float* gate, const float* up, float* out, int64_t count,
              cudaStream_t stream = nullptr);
// y += x over `count`.
void add(float* y, const float* x, int64_t count, cudaStream_t stream = nullptr);
// out[i, :] = table[ids[i], :] widened to f32 (table f32, bf16 or f16, `width` columns); an
// id outside [0, vocab) gives a zero row (the engine rejects such ids before they get here).
void embedding(const void* table, DType table_dtype, int64_t width, const int32_t* ids,
               int64_t count, float* out, int64_t vocab, cudaStream_t stream = nullptr);
// Where each head's vector starts in x: token * token_stride + head * head_stride floats (a
// slice of wider rows, as DeepSeek's rotary part of q).
struct RopeLayout {
  int64_t token_stride;
  int64_t head_stride;
};
// One token per draw from logits [rows, vocab] into out[count] (device memory), as
// deepinfer::draw_token does on the host.
void sample_rows(const float* logits, int64_t vocab, int64_t row_stride, const TokenDraw* draws,
                 int64_t count, DrawnToken* out, cudaStream_t stream = nullptr);
// One row's mask on the device for mask_rows: its bits start at words[first_word].
struct DeviceRowMask {
  int64_t row;
  int64_t first_word;
  int64_t marked;
};
// Sets to -infinity each masked row's logits whose bit is clear, and those from `marked` on.
void mask_rows(float* logits, int64_t vocab, int64_t row_stride, const DeviceRowMask* masks,
               const uint64_t* words, int64_t count, cudaStream_t stream = nullptr);
// Rotates x [tokens, heads, rotary_dim...] in place by cos/sin [tokens, rotary_dim / 2]: pairs
// (i, i + rotary_dim/2), or (2i, 2i+1) when interleaved.
void rope(float* x, RopeLayout layout, const float* cos, const float* sin, int64_t tokens,
          int heads, int rotary_dim, bool interleaved, cudaStream_t stream = nullptr);

// y[t, n] = sum_k x[t, k] * weight[n, k] for a bf16 weight [n, k] and few rows (decode):
// each weight byte is read once for all rows, 16 bytes per load. rows <= 8, k % 8 == 0.
void matmul_bf16_few_rows(const float* x, const uint16_t* weight, int64_t rows, int64_t n,
                          int64_t k, float* y, cudaStream_t stream = nullptr);
// Several such products of the same x (q/k/v, gate/up) in one launch: one pass of the
// weights and no launch gaps between them. Each product: weight [n, k] bf16, y [rows, n].
constexpr int kMaxFewRowsProducts = 4;
struct FewRowsProduct {
  const uint16_t* weight = nullptr;
  int64_t n = 0;
  float* y = nullptr;
  bool accumulate = false;  // y += x W^T (a residual update) instead of y = x W^T
};
// x's rows RMS-normalised and scaled by `weight` (f32, bf16 or f16) inside the launch, as
// rmsnorm would write them, before the products read them.
struct FewRowsNorm {
  const void* weight = nullptr;
  DType dtype = DType::kBF16;
  float eps = 0.0f;
};
void matmul_bf16_few_rows(const float* x, const FewRowsProduct* products, int count, int64_t rows,
                          int64_t k, cudaStream_t stream = nullptr,
                          const FewRowsNorm* norm = nullptr);
// The gated MLP's first half at decode in one launch: act[rows, n] = silu(x' gate^T) *
// (x' up^T) with x' = rmsnorm(x) * norm (required), gate and up bf16 [n, k]; the same bits
// as the two products then silu_mul. rows <= 8, few_rows_can_normalise(rows, k).
void matmul_bf16_few_rows_silu_gate(const float* x, const uint16_t* gate, const uint16_t* up,
                                    int64_t rows, int64_t n, int64_t k, float* act,
                                    const FewRowsNorm& norm, cudaStream_t stream = nullptr);
// The attention block's input half at decode in one launch: q, k and v = x' W^T with x' =
// rmsnorm(x) * norm (required), all three bf16 weights; q and k rotated as rope_kv_write
// rotates them and k, v stored into the cache slots `slot_mapping` names; q, k and v [rows,
// width] hold the results. The same bits as the products then rope_kv_write.
struct QkvRope {
  const uint16_t *q_weight = nullptr, *k_weight = nullptr, *v_weight = nullptr;
  float *q = nullptr, *k = nullptr, *v = nullptr;
  int heads = 0;
  const float* cos = nullptr;  // [rows, rotary_dim / 2]
  const float* sin = nullptr;
  int rotary_dim = 0;
  const int64_t* slot_mapping = nullptr;
  PagedKvView cache{};
};
void matmul_bf16_few_rows_qkv_rope(const float* x, int64_t rows, int64_t k, const QkvRope& job,
                                   const FewRowsNorm& norm, cudaStream_t stream = nullptr);
// Once per device, before any few-rows product (and outside graph capture): lets the
// kernels that stage x in shared memory use more than the default 48 KB of it.
void configure_few_rows_kernels();
// Which few-rows products of one or two rows stream their weight rows through shared memory
// in large bulk copies (row_stream.cuh) instead of loading them into registers: an OR of
// StreamUse bits; the same bits either way. DEEPINFER_CUDA_ROW_STREAM (the number) sets it at
// start; kDefaultRowStream otherwise.
enum StreamUse : int {
  kStreamPlain = 1,       // o, down: y (+)= x W^T
  kStreamGated = 2,       // gate/up + silu, x normalised inside
  kStreamNormalised = 4,  // one product of normalised x (lm_head)
  kStreamQkvRope = 8,     // q/k/v + rope + cache write, x normalised inside
};
// What measured fastest for batch-1 decode of a Llama-3.1-8B shape on the H200: the stream
// took batch 1 from 192 to 201-205 tok/s, gate/up gaining most; q/k/v + rope streamed was
// slower (200.5 against 209-210 tok/s) and stays on registers.
constexpr int kDefaultRowStream = kStreamPlain | kStreamGated | kStreamNormalised;
void set_row_stream(int uses);
int row_stream();
// The most bytes one of the row stream's bulk copies moves (16 KB by default; a multiple of
// 16): a stage of adjacent rows is copied in pieces of at most this.
void set_row_stream_copy_limit(uint32_t bytes);
// Whether the few-rows products can normalise x [rows, k] themselves (x fits the block's
// shared memory).
bool few_rows_can_normalise(int64_t rows, int64_t k);

// As Ops::rope_kv_write: q [tokens, heads, key_dim] and k [tokens, kv_heads, key_dim]
// contiguous, v [tokens, kv_heads, value_dim] with value_dim == key_dim, cos/sin
// [tokens, rotary_dim / 2].
void rope_kv_write(float* q, int heads, float* k, const float* v, const float* cos,
                   const float* sin, int rotary_dim, const int64_t* slot_mapping, int64_t tokens,
                   const PagedKvView& cache, cudaStream_t stream = nullptr);
// As Ops::kv_write: k [tokens, kv_heads * key_dim] (and v, unless the cache keeps values in
// keys) into the slots slot_mapping names. Every pointer on the device.
void kv_write(const float* k, const float* v, const int64_t* slot_mapping, int64_t tokens,
              const PagedKvView& cache, cudaStream_t stream = nullptr);
// How many contiguous shares of its keys each (row, KV head) of paged_attention is split
// into, for a batch whose longest context is `max_context` (decode of few sequences needs
// many to fill the chip); and the workspace floats that many splits need.
// With `arrivals` (at least rows * num_kv_heads zeroed counters, left zeroed) the last split
// of each (row, KV head) merges them; otherwise a merge kernel runs after.
struct SplitKeys {
  int splits = 1;
  unsigned* arrivals = nullptr;
  int64_t arrival_slots = 0;
};
int paged_attention_splits(int64_t rows, int num_kv_heads, int64_t max_context);
size_t paged_attention_workspace_floats(int64_t rows, int num_kv_heads, int splits);
// The most workspace floats paged_attention_splits' choices ever need, for a workspace set
// aside once: a buffer allocated per call would put allocation nodes into a captured decode
// graph, between the kernels, and those end the overlap of each kernel with the one before.
size_t paged_attention_workspace_limit_floats();

// As Ops::paged_attention over `rows` query rows of `heads` heads: causal, each sequence's
// keys through its block table, optionally windowed. Every pointer in q, batch, cache, out
// and workspace on the device. 128-wide GQA heads (up to 8 per KV head) take a grouped
// kernel that reads each K/V row once per group and, given a workspace, splits the keys
// over several blocks merged after; other shapes one block per (row, head).
void paged_attention(const float* q, int64_t rows, int heads, const AttentionBatch& batch,
                     const PagedKvView& cache, float scale, int window, float* out,
                     cudaStream_t stream = nullptr, SplitKeys split = {},
                     float* workspace = nullptr, size_t workspace_floats = 0);

// Prompt attention on the tensor cores (flash-attention style, bf16 Q/K/V with f32
// accumulation and softmax): the same contract as paged_attention for 128-wide K and V heads
// whose GQA group divides 64. CudaOps sends batches of mostly prompt rows here.
bool flash_attention_supports(int heads, const PagedKvView& cache);
void flash_attention(const float* q, int64_t rows, int heads, const AttentionBatch& batch,
                     const PagedKvView& cache, float scale, int window, float* out,
                     cudaStream_t stream = nullptr);

// The same for an f16 weight.
void matmul_f16_few_rows(const float* x, const uint16_t* weight, int64_t rows, int64_t n, int64_t k,
                         float* y, cudaStream_t stream = nullptr);
// The same for a DeepSeek-style FP8 e4m3 weight [n, k] with f32 scales per 128 x 128 block
// ([ceil(n / 128), ceil(k / 128)]): dequantised in registers, never widened in memory.
// rows <= 8, k % 16 == 0.
void matmul_fp8_few_rows(const float* x, const uint8_t* weight, const float* scales, int64_t rows,
                         int64_t n, int64_t k, float* y, cudaStream_t stream = nullptr);

// Columns of x that share one scale in an FP8 product (DeepSeek's activation groups), and
// the row multiple cuBLASLt's block-scaled kernels take (x is padded to it in scratch).
constexpr int64_t kFp8Group = 128;
constexpr int64_t kFp8RowMultiple = 8;

// Rows of an e4m3 copy of x in segments, one per product, each a multiple of kFp8RowMultiple
// rows: copy row r holds x's row source[r] (-1: zeros), and each segment keeps its scales
// token-major ([k / kFp8Group][its rows], from its first row * k / kFp8Group), the layout
// cuBLASLt reads 1 x 128 scales in. Device arrays; null source and segments: one segment whose
// first real_rows rows are x's.
struct Fp8Segments {
  const int32_t* source = nullptr;          // [rows]
  const int32_t* segment_of_row = nullptr;  // [rows]
  const int32_t* segment_first = nullptr;   // [segments + 1]: each one's first row, then rows
  int64_t rows = 0;
  int64_t real_rows = 0;
};

// The same product for any number of rows through cuBLASLt on the tensor cores, accumulation
// and y in f32: bf16 or f16 weights with x rounded to their type, or DeepSeek-style FP8
// weights with x quantised to e4m3 in groups of kFp8Group columns.
class LtMatmul {
 public:
  LtMatmul();
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;
  // dtype: the weight's, bf16 or f16; x is rounded to it into x_rounded [rows, k] first.
  void run(const float* x, uint16_t* x_rounded, const uint16_t* weight, DType dtype, int64_t rows,
           int64_t n, int64_t k, float* y, cudaStream_t stream = nullptr);
  // Whether run_fp8 takes a weight [n, k].
  static bool fp8_fits(int64_t n, int64_t k);
  // The scratch run_fp8 needs: x in e4m3 and its scales.
  static size_t fp8_scratch_bytes(int64_t rows, int64_t n, int64_t k);
  // An e4m3 weight [n, k] with f32 scales per 128 x 128 block ([ceil(n / 128), k / 128]).
  // False (nothing done) when cuBLASLt has no block-scaled FP8 algorithm for it on this GPU.
  bool run_fp8(const float* x, void* scratch, const uint8_t* weight, const float* weight_scales,
               int64_t rows, int64_t n, int64_t k, float* y, cudaStream_t stream = nullptr);

  // run_fp8 in pieces, for products that share their inputs' quantisation.
  // x [*, k] in f32 quantised to e4m3 rows out [segments.rows, k] and their scales.
  static void quantise_fp8(const float* x, const Fp8Segments& segments, int64_t k, void* out,
                           float* scales, cudaStream_t stream = nullptr);
  // Scratch multiply_fp8 needs for a weight's scales (cuBLASLt's stride rule).
  static size_t fp8_weight_scale_bytes(int64_t n, int64_t k);
  // Whether multiply_fp8 has an algorithm for rows x n x k (rows a multiple of
  // kFp8RowMultiple) with these scales on this GPU; asked of cuBLASLt once per shape.
  bool fp8_ready(int64_t rows, int64_t n, int64_t k, const float* weight_scales,
                 const float* x_scales, void* scale_scratch);
  // y [rows, n] = x * weight^T for one segment of quantise_fp8's rows (x_fp8 and x_scales at
  // the segment's first row); scale_scratch holds fp8_weight_scale_bytes(n, k).
  bool multiply_fp8(const void* x_fp8, const float* x_scales, int64_t rows, const uint8_t* weight,
                    const float* weight_scales, int64_t n, int64_t k, float* y, void* scale_scratch,
                    cudaStream_t stream = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A weight matrix [rows, cols] as the general kernels read it: f32, bf16, f16, or FP8 e4m3
// with f32 scales per block_rows x block_cols block ([.., scale_cols]).
struct DeviceWeight {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t cols = 0;
  const float* scales = nullptr;
  int64_t scale_cols = 0;
  int block_rows = 1;
  int block_cols = 1;
};

// y[rows, n] = x[rows, cols] * weight^T for any weight dtype and row count (16 x 16 tiles in
// shared memory; the fallback where no faster path applies).
void matmul_tiled(const float* x, const DeviceWeight& weight, int64_t rows, int64_t n, float* y,
                  cudaStream_t stream = nullptr);
// y[r, :] += bias for every row r.
void add_bias(float* y, const DeviceWeight& bias, int64_t rows, int64_t n,
              cudaStream_t stream = nullptr);
// As Ops::head_matmul over x [tokens, heads, *] and out with the given strides (elements).
void head_matmul(const float* x, int64_t x_token_stride, int64_t x_head_stride,
                 const DeviceWeight& weight, const HeadSlices& slices, bool transposed,
                 int64_t tokens, int heads, float* out, int64_t out_token_stride,
                 int64_t out_head_stride, cudaStream_t stream = nullptr);
// out[i] = x[rows[i]] over rows of `width` (rows on the device).
void gather_rows(const float* x, const int32_t* rows, int64_t count, int64_t width, float* out,
                 cudaStream_t stream = nullptr);
// Entries grouped by the row of y they add to: y[targets[t]] += scales[i] * x[i] for the
// entries i = entries[starts[t]], ..., entries[starts[t + 1] - 1], in that order (one block a
// target, so no two blocks write one row and the sums are deterministic). All on the device.
struct ScaledRows {
  const int32_t* targets;
  const int32_t* starts;   // [target_count + 1]
  const int32_t* entries;  // [starts[target_count]]
  const float* scales;     // by entry
  int64_t target_count;
};
void add_scaled_rows(float* y, const ScaledRows& rows, int64_t width, const float* x,
                     cudaStream_t stream = nullptr);
// out = gelu_tanh(gate) * up, elementwise.
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t count,
                   cudaStream_t stream = nullptr);
// destination[a, b, c, d] = source[a, b, c, d] over four right-aligned axes, strides in
// elements (a source stride may be 0).
struct StridedCopy {
  int64_t extent[4] = {1, 1, 1, 1};
  int64_t from[4] = {};
  int64_t to[4] = {};
};
void strided_copy(const float* source, float* destination, const StridedCopy& copy,
                  cudaStream_t stream = nullptr);

// As Ops::kv_read_keys, block_table on the device.
void kv_read_keys(const PagedKvView& cache, const int32_t* block_table, int64_t count, float* keys,
                  cudaStream_t stream = nullptr);

// Mixture of experts on the device (moe.cu), for batches small enough to route there.
constexpr int kMaxRoutedExperts = 1024;
constexpr int kMaxExpertsPerToken = 16;
constexpr int kMaxRoutedPairs = 4096;  // tokens * experts_per_token
constexpr int kScaleBlockEdge = 128;   // the FP8 experts' scale blocks are 128 x 128

// One of the experts' matrices (gate, up or down) for every expert: device arrays indexed by
// expert.
struct ExpertMatrix {
  const void* const* weights = nullptr;  // each [n, k], bf16 or FP8 e4m3
  const float* const* scales = nullptr;  // FP8: each expert's 128 x 128 block scales
  int64_t n = 0;
  int64_t scale_cols = 0;
};
struct ExpertWeights {
  ExpertMatrix gate, up, down;
  DType dtype = DType::kBF16;
  int64_t inter = 0;  // the experts' intermediate width
};

// Hash routing: token t's experts are row (token_ids ? token_ids[t] : t) of table
// [rows, experts_per_token] (device memory); the scores still weigh them. A null table lets
// the scores choose.
struct FixedExperts {
  const int32_t* table = nullptr;
  const int32_t* token_ids = nullptr;
};

// The CPU's route_token for each row of logits [tokens, num_experts], on the device:
// experts/weights [tokens * experts_per_token]; correction_bias may be null.
void route_experts(const float* logits, int64_t tokens, const float* correction_bias,
                   FixedExperts fixed, const ExpertRouting& routing, int32_t* experts,
                   float* weights, cudaStream_t stream = nullptr);
size_t routed_experts_workspace_bytes(int64_t tokens, const ExpertRouting& routing, int64_t hidden,
                                      int64_t inter);
// out [tokens, hidden] += Ops::routed_experts' sum for x [tokens, hidden], all on the device;
// workspace holds routed_experts_workspace_bytes. fp8_activations lets FP8 experts whose
// widths routed_experts_on_tensor_cores takes run on the tensor cores with x and the
// activations quantised to e4m3 (per row and 128-wide block); otherwise the products are f32.
void routed_experts(const float* x, const float* router_logits, int64_t tokens, int64_t hidden,
                    const float* correction_bias, FixedExperts fixed, const ExpertRouting& routing,
                    const ExpertWeights& weights, bool fp8_activations, void* workspace, float* out,
                    cudaStream_t stream = nullptr);
bool routed_experts_on_tensor_cores(int64_t hidden, int64_t inter, DType dtype);
// Whether routed_experts' products take these widths (hidden and expert width in whole
// weight chunks); other widths take the general path.
bool routed_experts_fit(int64_t hidden, int64_t inter, DType dtype);

}  // namespace deepinfer::cuda

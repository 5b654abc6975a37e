// The op seam: every computation a model needs, behind one interface per backend, and the
// memory those computations work in. Activations are f32; weights are read in their stored
// dtype (f32, bf16, f16, and FP8 e4m3 with block scales).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace deepinfer {

// Paged KV storage of one layer: keys [num_blocks, block_size, num_kv_heads, key_dim] and
// values [..., value_dim] of `dtype` (f32; GPU backends keep bf16). With values_in_keys the
// value of a token is the first value_dim elements of its key (MLA's latent cache: one
// 576-wide "head" whose first 512 are the value).
struct PagedKvView {
  void* keys = nullptr;
  void* values = nullptr;  // == keys when values_in_keys
  int block_size = 0;
  int num_kv_heads = 0;
  int key_dim = 0;
  int value_dim = 0;
  bool values_in_keys = false;
  DType dtype = DType::kF32;

  // The storage of an f32 cache (what the CPU backend keeps).
  float* key_floats() const { return static_cast<float*>(keys); }
  float* value_floats() const { return static_cast<float*>(values); }

  int64_t key_stride() const { return int64_t{num_kv_heads} * key_dim; }
  int64_t value_stride() const {
    return values_in_keys ? key_stride() : int64_t{num_kv_heads} * value_dim;
  }
};

// The sequences of a flattened batch, as attention sees them. Sequence s owns query rows
// [query_start[s], query_start[s+1]); those are its newest tokens, so its cache holds
// context_lens[s] tokens including them, addressed through its row of block_tables.
struct AttentionBatch {
  int num_seqs = 0;
  const int32_t* query_start = nullptr;   // [num_seqs + 1]
  const int32_t* context_lens = nullptr;  // [num_seqs]
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  const int64_t* slot_mapping =
      nullptr;  // [tokens]: block * block_size + offset for each new token
  // The longest context_lens entry, known on the host (a GPU backend sizes its launch by it
  // without reading context_lens back).
  int64_t max_context_len = 0;
  // [num_seqs] or null (all 0): the first position a sequence's sliding-window layers hold.
  // A replayed prefix (PrefixReplay) starts its windows there; keys before it are absent, so
  // windowed attention never reads them.
  const int32_t* first_positions = nullptr;

  // Host-side read of first_positions (a CPU backend's batch).
  int64_t window_start(int seq) const { return first_positions ? first_positions[seq] : 0; }
};

// One of several matmuls run as one parallel pass. They read the call's shared input unless
// the job names its own (MoE experts each read their own tokens).
struct MatmulJob {
  const Tensor* weight;
  const Tensor* bias;  // may be null
  Tensor* out;
  const Tensor* input = nullptr;
};

// Per-head products with row slices of one weight W [rows, K]: head h uses rows
// [h * head_stride + row_begin, ... + rows). MLA keeps W_UK and W_UV inside kv_b_proj this way.
struct HeadSlices {
  int64_t head_stride = 0;
  int64_t row_begin = 0;
  int64_t rows = 0;
};

// How a mixture-of-experts router turns logits into experts (DeepSeek-V2/V3 and relatives).
struct ExpertRouting {
  // kSqrtSoftplus: sqrt(softplus(logit)) (DeepSeek-V4).
  enum class Scoring { kSoftmax, kSigmoid, kSqrtSoftplus };
  // kNone: top-k over all experts. kBestExpert (V2 group_limited_greedy): groups ranked by
  // their best score. kTopTwoSum (V3 noaux_tc): ranked by the sum of their two best biased
  // scores. Experts outside the kept groups score 0 (not -inf), as DeepSeek and transformers do.
  enum class GroupRanking { kNone, kBestExpert, kTopTwoSum };
  int num_experts = 0;
  int experts_per_token = 0;
  Scoring scoring = Scoring::kSoftmax;
  GroupRanking group_ranking = GroupRanking::kNone;
  int num_groups = 1;
  int topk_groups = 1;
  bool normalize = false;  // divide the chosen weights by their sum
  float scaling = 1.0f;    // routed_scaling_factor, applied last
  // > 0: the experts' SwiGLU clamps the gate product from above and the up product on both
  // sides at this limit (DeepSeek-V4's swiglu_limit).
  float swiglu_limit = 0.0f;
};

// The routed experts of one MoE layer: expert e is the gated MLP
// down[e](silu(gate[e] x) * up[e] x); correction_bias (may be empty) is the router's
// noaux_tc bias, as route_experts takes it.
struct RoutedExperts {
  ExpertRouting routing;
  std::vector<float> correction_bias;
  std::vector<const Tensor*> gate, up, down;
  // Hash routing (DeepSeek-V4's first layers): each token id's experts, [vocab, k]; empty
  // when the router chooses.
  std::vector<int32_t> token_experts;
};

// DeepSeek-V4's hyper-connections at one site: f32 parameters in backend memory, fn
// [mixes, streams * width], base [mixes], scale [3]; the final head has mixes = streams and
// scale [1].
struct HyperConnection {
  const Tensor* fn = nullptr;
  const Tensor* base = nullptr;
  const Tensor* scale = nullptr;
  int streams = 0;
  int sinkhorn_iterations = 0;
  float eps = 0.0f;       // hc_eps
  float norm_eps = 0.0f;  // of the unweighted RMSNorm over all streams
};

// Floats a layer keeps per token across consecutive cache layers of `row` floats (DeepSeek-V4's
// compressor inputs and compressed entries): element e of a token's record is column
// (offset + e) % row of layer (offset + e) / row, whose slot comes from that layer's block
// tables [num_seqs, max_blocks_per_seq]. Pointers are in backend memory.
struct PagedRecords {
  std::vector<float*> layers;
  std::vector<const int32_t*> tables;
  int max_blocks_per_seq = 0;
  int block_size = 0;
  int row = 0;
  int64_t offset = 0;
};

// One of DeepSeek-V4's compressors: entry w of a sequence pools, per channel, the `rate`
// tokens of window w (overlapping: the first `width` channels of window w - 1's tokens with the
// second `width` of window w's) by a softmax over gates plus position bias, then normalises and
// rotates it. Its inputs are `projected` values then `projected` gates at input_offset of
// the token's input record.
struct Compressor {
  const Tensor* position_bias = nullptr;  // [rate, projected] f32
  const Tensor* norm = nullptr;           // [width]
  int width = 0;
  int rate = 0;
  bool overlapping = false;
  int64_t input_offset = 0;
  int64_t entry_offset = 0;  // of its part in the entry (attention entry, then indexer key)
  float eps = 0.0f;
  int rope_dims = 0;  // the trailing dims that rotate, pairs (2i, 2i + 1)
  int projected() const { return overlapping ? 2 * width : width; }
};

// Where DeepSeek-V4 entries lie: entry w's element c is at the token w * rate + c / stripe,
// column c % stripe of its record.
struct EntryStripes {
  PagedRecords records;
  int64_t stripe = 0;
  int rate = 0;
};

// One row's draw for Ops::sample_rows: the sampling that needs nothing but the logits (rows
// with penalties, logit bias or a grammar mask are sampled on the host).
struct TokenDraw {
  int64_t row = 0;           // the logits row
  float temperature = 0.0f;  // 0: greedy (the lowest id among equal maxima)
  int32_t top_k = 0;         // <= 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  double uniform = 0.0;      // the draw, in [0, 1)
  bool with_logprob = true;  // false: the host reference skips the logprob (a pass of exps)
};

// One row's token mask for Ops::mask_rows: bits by token id (64 a word, host memory) over the
// first `marked` ids; every id from `marked` on is banned too.
struct RowMask {
  int64_t row = 0;
  const uint64_t* bits = nullptr;
  int32_t marked = 0;
};

struct DrawnToken {
  int32_t token = 0;
  float logprob = 0.0f;  // under the raw logits (log_softmax at temperature 1), if asked for
};

// The reference every backend's sample_rows matches, on one host row. Probabilities are
// exp((logit - max) / temperature) scaled to 2^40 at the most likely token and rounded down
// to integers, so sums (top-p's running mass, the draw's cumulative) are exact and the same
// in any order: a GPU's parallel sums give the same token as this loop. Tokens are ranked by
// (probability, then lower id); top-k, then top-p (the shortest ranked prefix holding at
// least top_p of the mass), then min-p (dropping tokens under min_p of the best) cut that
// ranking; the draw walks the kept tokens in id order.
DrawnToken draw_token(const float* logits, int64_t vocab, const TokenDraw& draw);
// The integer masses draw_token draws from under `draw` (its uniform aside), per token: a
// survivor's weight, 0 for the tokens top-k, top-p and min-p drop; greedy: 1 on the token it
// picks, 0 elsewhere. They never sum to 0.
void draw_masses(const float* logits, int64_t vocab, const TokenDraw& draw,
                 std::vector<uint64_t>& masses);

// Memory a backend's kernels work in: host memory for the CPU, device memory for a GPU.
// Shared ownership, so a view's owner can be handed around freely.
using BackendMemory = std::shared_ptr<void>;

// `bytes` of zeroed host memory aligned for vector loads.
BackendMemory host_memory(size_t bytes);

// Work recorded from a backend's queue, replayed as one launch (a CUDA graph).
class RecordedOps {
 public:
  virtual ~RecordedOps() = default;
  virtual void replay() = 0;
};

// The chosen (row, expert) pairs of an MoE layer grouped by expert, each expert's rows in row
// order: one gather, one activation and one combine serve every expert of the batch.
struct ExpertGroups {
  std::vector<int32_t> rows;    // pair -> row of x
  std::vector<float> scales;    // pair -> routing weight
  std::vector<size_t> experts;  // the chosen experts, ascending
  std::vector<int64_t> first;   // each chosen expert's first pair, then the pair count
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual std::string name() const = 0;
  // Where tensors given to this backend's ops must live (weights, activations, KV, tables).
  virtual Device device() const { return Device::kCpu; }
  // `bytes` of zeroed memory where the kernels work.
  virtual BackendMemory allocate(size_t bytes) { return host_memory(bytes); }
  // The same, contents unspecified: for activations every reader finds written first.
  virtual BackendMemory allocate_scratch(size_t bytes) { return allocate(bytes); }
  // Host memory this backend copies to and from fastest (page-locked for a GPU): where
  // logits land every step.
  virtual BackendMemory allocate_host(size_t bytes) { return host_memory(bytes); }
  // Copies between host memory and the backend's memory. to_host waits for the work queued
  // before it; to_backend may return before the copy lands (later ops see it).
  virtual void to_backend(void* destination, const void* source, size_t bytes);
  virtual void to_host(void* destination, const void* source, size_t bytes);
  // A copy inside the backend's memory (device to device on a GPU), queued like its ops.
  virtual void copy_within(void* destination, const void* source, size_t bytes);
  // Waits for all queued work.
  virtual void synchronize() {}
  // Records the ops `work` submits without running them, for replays that read and write the
  // same memory (whose contents may change between replays). `work` must not copy to or from
  // the host. Null where the backend cannot record (the CPU runs ops as they come).
  virtual std::unique_ptr<RecordedOps> record(const std::function<void()>& work) {
    (void)work;
    return nullptr;
  }
  // Bytes the backend's memory can still give: MemAvailable for the CPU, free device memory
  // for a GPU. KV caches sized as a fraction of memory take a fraction of this.
  virtual size_t available_memory() const;
  // The element type KV caches for this backend store (bf16 halves a GPU's attention reads).
  virtual DType kv_dtype() const { return DType::kF32; }
  // Whether results are bitwise independent of batch composition and prefill chunking.
  virtual bool batch_invariant() const { return false; }

  // y[T, N] = x[T, K] * weight[N, K]^T (+ bias[N]). weight is f32, bf16, f16 or block-scaled
  // FP8.
  virtual void matmul(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& y) = 0;
  // Several matmuls of the same x (q/k/v, gate/up) as one parallel pass, so decode pays one
  // thread-pool round trip instead of one per matrix. Same results as separate calls.
  virtual void matmuls(const Tensor& x, const std::vector<MatmulJob>& jobs) = 0;
  // The pre-norm of a transformer block and the products that read it: matmuls over
  // rmsnorm(x) * norm_weight. `normed` ([rows, x width]) is scratch for backends that write
  // the normalised rows out (the CPU; a GPU normalises inside the decode products instead).
  virtual void norm_matmuls(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed,
                            const std::vector<MatmulJob>& jobs);
  // The gated MLP's first half: act = silu(g) * u for g and u the products of norm_matmuls
  // (rmsnorm(x) * norm_weight) with the jobs `gate` and `up`. act may be gate's out; a
  // backend that multiplies inside the products (a GPU at decode) may leave the jobs' outs
  // unwritten.
  virtual void norm_silu_gate(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed,
                              const MatmulJob& gate, const MatmulJob& up, Tensor& act);
  // The residual update after attention or the MLP: y += x W^T (+ bias). `scratch` ([rows,
  // n]) is where backends that add in a second pass put the product (a GPU adds inside the
  // decode product).
  virtual void matmul_add(const Tensor& x, const Tensor& weight, const Tensor* bias,
                          Tensor& scratch, Tensor& y);
  // x [T, H, *] and out [T, H, *] may be strided views (last axis contiguous).
  //   transposed = false: out[t, h, :rows] = x[t, h, :K] * W_h^T     (W_h = the head's rows)
  //   transposed = true:  out[t, h, :K]    = x[t, h, :rows] * W_h
  virtual void head_matmul(const Tensor& x, const Tensor& weight, const HeadSlices& slices,
                           bool transposed, Tensor& out) = 0;
  // destination = source elementwise (f32, same shape, rank <= 4, any strides: a source
  // stride of 0 repeats it along that axis). Moves MLA's per-head pieces between layouts.
  virtual void copy(const Tensor& source, Tensor& destination) = 0;
  // out[i] = x[rows[i]]; and y[rows[i]] += scales[i] * x[i] (rows may repeat).
  virtual void gather_rows(const Tensor& x, const std::vector<int32_t>& rows, Tensor& out) = 0;
  virtual void add_scaled_rows(Tensor& y, const std::vector<int32_t>& rows,
                               const std::vector<float>& scales, const Tensor& x) = 0;
  // Chooses experts_per_token experts per row of router_logits [T, num_experts] into
  // experts/weights [T * experts_per_token]. correction_bias (may be empty) shifts the scores
  // used to choose, never the weights. fixed_experts (host, [T * experts_per_token], may be
  // empty) names the experts instead (hash routing by token id); the scores still weigh them.
  virtual void route_experts(const Tensor& router_logits, const std::vector<float>& correction_bias,
                             const ExpertRouting& routing,
                             const std::vector<int32_t>& fixed_experts, int32_t* experts,
                             float* weights) = 0;
  // out [T, hidden] += the weighted sum, over the experts route_experts chooses for each row
  // of router_logits [T, num_experts], of those experts' outputs for the row of x [T, hidden].
  // With hash routing, row t's experts are experts.token_experts' row token_ids[t]
  // (token_ids in backend memory, [T]; unread otherwise). The default groups the rows by
  // expert on the host and runs each chosen expert once over its rows; a GPU keeps decode
  // batches on the device.
  virtual void routed_experts(const Tensor& x, const Tensor& router_logits,
                              const RoutedExperts& experts, const int32_t* token_ids, Tensor& out);
  // out[i] = table[ids[i]] widened to f32.
  virtual void embedding(const Tensor& table, const int32_t* ids, Tensor& out) = 0;
  // RMS-normalises each row of x (the last axis) and scales by weight; y may alias x.
  virtual void rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& y) = 0;
  // y += x, elementwise.
  virtual void add(Tensor& y, const Tensor& x) = 0;
  // Rotates x [T, heads, head_dim] in place by cos/sin [T, rotary_dim / 2]. Pairs are
  // (i, i + rotary_dim/2) (Llama/Qwen layout) or (2i, 2i+1) when interleaved (DeepSeek).
  virtual void rope(Tensor& x, const float* cos, const float* sin, int rotary_dim,
                    bool interleaved) = 0;
  // out = act(gate) * up, elementwise; out may alias gate.
  virtual void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) = 0;
  // out = silu(min(gate, limit)) * clamp(up, -limit, limit); out may alias gate.
  virtual void clamped_silu_mul(const Tensor& gate, const Tensor& up, float limit, Tensor& out) = 0;
  virtual void gelu_tanh_mul(const Tensor& gate, const Tensor& up, Tensor& out) = 0;
  // Writes k [T, num_kv_heads, key_dim] and v [T, num_kv_heads, value_dim] (null when the
  // cache keeps values inside keys) into the slots batch.slot_mapping names.
  virtual void kv_write(const Tensor& k, const Tensor* v, const AttentionBatch& batch,
                        const PagedKvView& cache) = 0;
  // Rotates q [T, heads, head_dim] and k [T, kv_heads, head_dim] as rope does (pairs i and
  // i + rotary_dim / 2) and writes k and v into the cache as kv_write does: one kernel where
  // a GPU would launch three per layer.
  virtual void rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const float* cos,
                             const float* sin, int rotary_dim, const AttentionBatch& batch,
                             const PagedKvView& cache);
  // The attention block's input half: norm_matmuls with the q, k and v jobs, then
  // rope_kv_write over q_heads, k_heads and v_heads (the jobs' outputs viewed as [T, heads,
  // head_dim]). One launch where a GPU decode would take two.
  virtual void norm_qkv_rope_write(const Tensor& x, const Tensor& norm_weight, float eps,
                                   Tensor& normed, const std::vector<MatmulJob>& qkv,
                                   Tensor& q_heads, Tensor& k_heads, const Tensor& v_heads,
                                   const float* cos, const float* sin, int rotary_dim,
                                   const AttentionBatch& batch, const PagedKvView& cache);
  // Copies the keys of cached tokens [0, count) of one sequence into keys [count, key width].
  virtual void kv_read_keys(const PagedKvView& cache, const int32_t* block_table, int64_t count,
                            Tensor& keys) = 0;
  // Causal attention of q [T, heads, key_dim] over each sequence's cached keys into
  // out [T, heads, value_dim]; `window` > 0 limits each query to itself and the window-1 keys
  // before it.
  virtual void paged_attention(const Tensor& q, const AttentionBatch& batch,
                               const PagedKvView& cache, float scale, int window, Tensor& out) = 0;
  // One token per draw from logits [rows, vocab] (f32, backend memory; each row's values
  // adjacent, rows possibly further apart, as in a view of a wider buffer's first columns)
  // into out[draws.size()] (host memory), as draw_token does.
  virtual void sample_rows(const Tensor& logits, const std::vector<TokenDraw>& draws,
                           DrawnToken* out) = 0;
  // Sets to -infinity, in logits [rows, vocab] laid out as for sample_rows, every token a
  // mask does not allow in its row (as ban_unmarked in core/token_bits.h): a grammar's mask
  // applied where the logits are, before sample_rows draws from them.
  virtual void mask_rows(Tensor& logits, const std::vector<RowMask>& masks) = 0;

  // DeepSeek-V4. Per row of streams [T, streams * width]: mix [T, (2 + streams) * streams]
  // holds pre, post and the Sinkhorn-normalised comb (row-major streams x streams), and
  // collapsed [T, width] = sum_j pre_j stream_j. With mix null (the final head) only pre.
  virtual void hc_pre(const Tensor& streams, const HyperConnection& hc, Tensor* mix,
                      Tensor& collapsed) = 0;
  // streams[k] = post_k * out + sum_j comb[j, k] streams[j], per row.
  virtual void hc_post(const Tensor& out, const Tensor& mix, Tensor& streams) = 0;
  // Writes values [T, width] (contiguous rows) as the records of the batch's new tokens.
  virtual void write_records(const Tensor& values, const AttentionBatch& batch,
                             const PagedRecords& records) = 0;
  // Pools the listed windows (`count` pairs sequence, window in backend memory; a pair with a
  // negative sequence is skipped, so a recorded step can list one per row) of `inputs` into
  // their entries' parts, rotated by cos/sin [count, rope_dims / 2] (backend memory) at each
  // window's first position.
  virtual void compress_windows(const PagedRecords& inputs, const Compressor& compressor,
                                const int32_t* windows, int64_t count, const float* cos,
                                const float* sin, const EntryStripes& entries) = 0;
  // The lightning indexer: for each row (position p of its sequence) the top `k` entries
  // w < (p + 1) / rate by sum_h scale * weights[h] * relu(queries[h] . key_w), ties to the
  // lower index; keys at key_offset of each entry. selected [T, k] (backend memory), -1
  // past the visible entries.
  virtual void index_select(const Tensor& queries, const Tensor& head_weights, float scale,
                            const AttentionBatch& batch, const EntryStripes& entries,
                            int64_t key_offset, int k, int32_t* selected) = 0;
  // out [T, heads, dim] for q [T, heads, dim]: per row and head one softmax over the
  // sequence's K=V rows in its window (batch's tables for window_cache), its compressed
  // entries (`selected` [T, k], -1 skipped; null: all w < (p + 1) / rate; rate 0: none) and
  // sinks[head] (a logit without a value); keys are the values.
  virtual void sparse_attention(const Tensor& q, const AttentionBatch& batch,
                                const PagedKvView& window_cache, int window,
                                const EntryStripes& entries, const int32_t* selected, int k,
                                const Tensor& sinks, float scale, Tensor& out) = 0;

 protected:
  // routed_experts' routing on the host: x's rows' experts (hash-routed rows by token id)
  // grouped by expert, for the default path and a backend's own products.
  ExpertGroups group_routed_pairs(const Tensor& x, const Tensor& router_logits,
                                  const RoutedExperts& experts, const int32_t* token_ids);
  // Each chosen expert once over its rows, their outputs weighted into out.
  void run_expert_groups(const Tensor& x, const RoutedExperts& experts, const ExpertGroups& groups,
                         Tensor& out);
};

// An f32 tensor in a backend's memory for activations: its contents start unspecified.
class BackendTensor {
 public:
  BackendTensor() = default;
  BackendTensor(Ops& ops, std::initializer_list<int64_t> shape)
      : BackendTensor(ops, shape, false) {}
  // The same, every element 0.
  static BackendTensor zeros(Ops& ops, std::initializer_list<int64_t> shape);
  float* data() const { return static_cast<float*>(memory_.get()); }
  const Tensor& view() const { return view_; }
  int64_t dim(int axis) const { return view_.dim(axis); }
  int64_t numel() const { return view_.numel(); }

 private:
  BackendTensor(Ops& ops, std::initializer_list<int64_t> shape, bool zeroed);

  BackendMemory memory_;
  Tensor view_;
};

// Throws unless Ops::copy can take these two tensors.
void check_copy_shapes(const Tensor& source, const Tensor& destination);

// A copy of `bytes` of host data in the backend's memory; on the CPU the copy is skipped and
// the host pointer itself is returned (the caller keeps the data alive meanwhile).
const void* backend_copy(Ops& ops, const void* host, size_t bytes, BackendMemory& keep);

// How matmuls over bf16 weights treat activations with more than one row (prefill).
// kF32 keeps them in f32 (results match an f32 reference to ~1e-6); kBf16 rounds them to bf16
// and uses the CPU's bf16 dot products where it has them (AVX512-BF16), as llama.cpp and
// vLLM's CPU backend do: about twice the arithmetic rate, with bf16 rounding of activations.
enum class MatmulPrecision { kF32, kBf16 };

// The CPU backend; picks AVX-512, AVX2 or portable kernels for this CPU at run time
// (DEEPINFER_ISA=avx512|avx2|generic overrides, for testing every path).
// batch_invariant: every matmul and attention sums in one fixed order whatever the batch
// holds, so a sequence's logits are bitwise the same alone, batched or chunked (slower decode:
// the single-row kernels' extra accumulators change the order and are not used).
std::unique_ptr<Ops> make_cpu_ops(MatmulPrecision precision = MatmulPrecision::kF32,
                                  bool batch_invariant = false);

}  // namespace deepinfer

#include "kernels/cuda/cuda_ops.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/deepseek_v4_kernels.h"
#include "kernels/cuda/device_tensors.h"
#include "kernels/cuda/expert_tables.h"
#include "kernels/cuda/grouped_experts.h"

namespace deepinfer::cuda {
namespace {

// Up to this many rows a product streams the weight once through the few-rows kernels. For
// bf16 and f16 weights those lose to cuBLASLt from 4 rows on (8B-shaped decode step, H100,
// both in recorded graphs: 4 / 5 / 8 rows 9.85 / 14.71 / 25.44 ms few-rows against 8.86 /
// 9.00 / 9.61 ms on cuBLASLt; 3 rows 8.39-8.44 against 8.75 ms); FP8's row limit is unmeasured.
constexpr int kFewRows = 8;
constexpr int kFewRowsHalf = 3;

class CudaGraph final : public RecordedOps {
 public:
  CudaGraph(cudaGraphExec_t exec, std::shared_ptr<CUstream_st> stream)
      : exec_(exec), stream_(std::move(stream)) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  void replay() override { check_cuda(cudaGraphLaunch(exec_, stream_.get()), "graph launch"); }

 private:
  cudaGraphExec_t exec_;
  std::shared_ptr<CUstream_st> stream_;
};

class CudaOps final : public Ops {
 public:
  CudaOps(int device, MatmulPrecision precision) : device_(device), precision_(precision) {
    int count = device_count();
    if (device < 0 || device >= count)
      fail("CUDA backend: GPU {} asked for, {} present", device, count);
    check_cuda(cudaSetDevice(device), "set device");
    cudaStream_t stream = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    // Allocations free back to the stream's pool, so the stream must outlive every one.
    stream_ = std::shared_ptr<CUstream_st>(stream, [](cudaStream_t s) { cudaStreamDestroy(s); });
    cudaMemPool_t pool = nullptr;
    check_cuda(cudaDeviceGetDefaultMemPool(&pool, device), "memory pool");
    uint64_t keep_everything = std::numeric_limits<uint64_t>::max();
    check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything),
               "pool threshold");
    cudaDeviceProp properties{};
    check_cuda(cudaGetDeviceProperties(&properties, device), "properties");
    name_ = std::string("cuda-") + properties.name;
    lt_ = std::make_unique<LtMatmul>();
    configure_few_rows_kernels();
    attention_arrivals_ = allocate(kAttentionArrivalSlots * sizeof(unsigned));
    attention_workspace_ = allocate(paged_attention_workspace_limit_floats() * sizeof(float));
  }

  std::string name() const override { return name_; }
  Device device() const override { return Device::kCuda; }
  DType kv_dtype() const override { return DType::kBF16; }

  BackendMemory allocate(size_t bytes) override {
    BackendMemory memory = allocate_scratch(bytes);
    if (bytes > 0) check_cuda(cudaMemsetAsync(memory.get(), 0, bytes, stream()), "zero");
    return memory;
  }

  BackendMemory allocate_scratch(size_t bytes) override {
    void* data = nullptr;
    check_cuda(cudaMallocAsync(&data, std::max<size_t>(bytes, 1), stream()), "allocate");
    std::shared_ptr<CUstream_st> owner = stream_;
    return BackendMemory(data, [owner](void* p) { cudaFreeAsync(p, owner.get()); });
  }

  BackendMemory allocate_host(size_t bytes) override {
    void* data = nullptr;
    check_cuda(cudaMallocHost(&data, std::max<size_t>(bytes, 1)),
               "allocate page-locked host memory");
    return BackendMemory(data, [](void* p) { cudaFreeHost(p); });
  }

  void to_backend(void* destination, const void* source, size_t bytes) override {
    if (bytes == 0) return;
    check_cuda(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyHostToDevice, stream()),
               "copy to device");
  }

  void copy_within(void* destination, const void* source, size_t bytes) override {
    if (bytes == 0) return;
    check_cuda(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, stream()),
               "copy on the device");
  }

  void to_host(void* destination, const void* source, size_t bytes) override {
    if (bytes > 0) {
      check_cuda(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToHost, stream()),
                 "copy to host");
    }
    synchronize();
  }

  void synchronize() override { check_cuda(cudaStreamSynchronize(stream()), "synchronize"); }

  std::unique_ptr<RecordedOps> record(const std::function<void()>& work) override {
    check_cuda(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal), "begin capture");
    try {
      work();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(stream(), &broken);
      if (broken) cudaGraphDestroy(broken);
      cudaGetLastError();  // the capture's error is reported by the exception
      throw;
    }
    cudaGraph_t graph = nullptr;
    check_cuda(cudaStreamEndCapture(stream(), &graph), "end capture");
    cudaGraphExec_t exec = nullptr;
    cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    check_cuda(status, "graph instantiate");
    return std::make_unique<CudaGraph>(exec, stream_);
  }

  // The stream-ordered pool keeps freed memory (a finished engine's KV cache, say) reserved:
  // it is handed back to the device first, or a second cache would be sized from what the
  // first one left.
  size_t available_memory() const override {
    check_cuda(cudaStreamSynchronize(stream()), "synchronize");
    cudaMemPool_t pool = nullptr;
    check_cuda(cudaDeviceGetDefaultMemPool(&pool, device_), "memory pool");
    check_cuda(cudaMemPoolTrimTo(pool, 0), "pool trim");
    size_t free = 0, total = 0;
    check_cuda(cudaMemGetInfo(&free, &total), "memory info");
    return free;
  }

  void matmul(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& y) override {
    require_device(x, "matmul");
    require_device(weight, "matmul");
    require_device(y, "matmul");
    int64_t k = weight.dim(1);
    int64_t n = weight.dim(0);
    int64_t rows = rows_of(x);
    DI_CHECK(x.dim(-1) == k && y.dim(-1) == n && rows_of(y) == rows,
             "matmul: x {} and y {} must be rows matching weight {}", x.shape_string(),
             y.shape_string(), weight.shape_string());
    // Slices of wider rows (MLA's latents) go through a packed copy: the kernels take dense rows.
    if (!x.is_contiguous() || !y.is_contiguous()) {
      BackendMemory x_memory, y_memory;
      Tensor packed_x = x.is_contiguous() ? x : packed_copy(x, x_memory, true);
      Tensor packed_y = y.is_contiguous() ? y : packed_copy(y, y_memory, false);
      matmul(packed_x, weight, bias, packed_y);
      if (!y.is_contiguous()) copy(packed_y, y);
      return;
    }
    product(x.as<const float>(), weight, rows, y.as<float>());
    if (bias) {
      require_device(*bias, "matmul bias");
      add_bias(y.as<float>(), device_weight(*bias), rows, n, stream());
    }
  }

  // Decode products of the shared x over bf16 weights go out together, a few per launch;
  // the rest one by one.
  void matmuls(const Tensor& x, const std::vector<MatmulJob>& jobs) override {
    std::vector<const MatmulJob*> together;
    for (const MatmulJob& job : jobs) {
      if (fits_few_rows_group(x, job)) {
        together.push_back(&job);
      } else {
        matmul(job.input ? *job.input : x, *job.weight, job.bias, *job.out);
      }
    }
    for (size_t first = 0; first < together.size(); first += kMaxFewRowsProducts) {
      size_t count = std::min<size_t>(kMaxFewRowsProducts, together.size() - first);
      few_rows_group(x,
                     {together.begin() + static_cast<std::ptrdiff_t>(first),
                      together.begin() + static_cast<std::ptrdiff_t>(first + count)},
                     nullptr, false);
    }
  }

  // Decode: the norm happens inside the products' launch (one kernel fewer per block).
  void norm_matmuls(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed,
                    const std::vector<MatmulJob>& jobs) override {
    bool inside = !jobs.empty() && jobs.size() <= kMaxFewRowsProducts &&
                  norm_weight.device == Device::kCuda && norm_weight.numel() == x.dim(-1) &&
                  few_rows_can_normalise(rows_of(x), x.dim(-1));
    std::vector<const MatmulJob*> group;
    for (const MatmulJob& job : jobs) {
      inside = inside && fits_few_rows_group(x, job);
      group.push_back(&job);
    }
    if (!inside) {
      Ops::norm_matmuls(x, norm_weight, eps, normed, jobs);
      return;
    }
    FewRowsNorm norm{norm_weight.data, norm_weight.dtype, eps};
    few_rows_group(x, group, &norm, false);
  }

  // Decode: gate and up in one launch that normalises x and multiplies silu(g) * u inside
  // (two kernels fewer per MLP); the jobs' outputs stay unwritten.
  void norm_silu_gate(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed,
                      const MatmulJob& gate, const MatmulJob& up, Tensor& act) override {
    const int64_t rows = rows_of(x), n = gate.weight->dim(0);
    const bool inside = !gate.bias && !up.bias && fits_few_rows_group(x, gate) &&
                        fits_few_rows_group(x, up) && up.weight->dim(0) == n &&
                        norm_weight.device == Device::kCuda && norm_weight.numel() == x.dim(-1) &&
                        few_rows_can_normalise(rows, x.dim(-1)) && act.device == Device::kCuda &&
                        act.is_contiguous() && act.numel() == rows * n;
    if (!inside) {
      Ops::norm_silu_gate(x, norm_weight, eps, normed, gate, up, act);
      return;
    }
    matmul_bf16_few_rows_silu_gate(x.as<const float>(), gate.weight->as<const uint16_t>(),
                                   up.weight->as<const uint16_t>(), rows, n, x.dim(-1),
                                   act.as<float>(),
                                   FewRowsNorm{norm_weight.data, norm_weight.dtype, eps}, stream());
  }

  // Decode: the q/k/v products, rope and the cache write in one launch (one kernel fewer per
  // attention block) when the three are plain bf16 products and the cache rope_kv_write's.
  void norm_qkv_rope_write(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed,
                           const std::vector<MatmulJob>& qkv, Tensor& q_heads, Tensor& k_heads,
                           const Tensor& v_heads, const float* cos, const float* sin,
                           int rotary_dim, const AttentionBatch& batch,
                           const PagedKvView& cache) override {
    const int64_t rows = rows_of(x);
    bool inside = qkv.size() == 3 && norm_weight.device == Device::kCuda &&
                  norm_weight.numel() == x.dim(-1) && few_rows_can_normalise(rows, x.dim(-1)) &&
                  q_heads.rank == 3 && k_heads.rank == 3 && !cache.values_in_keys &&
                  cache.value_dim == cache.key_dim && k_heads.dim(1) == cache.num_kv_heads &&
                  k_heads.dim(2) == cache.key_dim && q_heads.dim(2) == cache.key_dim &&
                  rotary_dim % 2 == 0 && (cache.key_dim - rotary_dim) % 2 == 0;
    for (const MatmulJob& job : qkv) inside = inside && !job.bias && fits_few_rows_group(x, job);
    inside = inside && qkv[0].out->data == q_heads.data && qkv[1].out->data == k_heads.data &&
             qkv[2].out->data == v_heads.data &&
             qkv[0].weight->dim(0) == q_heads.dim(1) * q_heads.dim(2) &&
             qkv[1].weight->dim(0) == k_heads.dim(1) * k_heads.dim(2) &&
             qkv[2].weight->dim(0) == k_heads.dim(1) * k_heads.dim(2);
    if (!inside) {
      Ops::norm_qkv_rope_write(x, norm_weight, eps, normed, qkv, q_heads, k_heads, v_heads, cos,
                               sin, rotary_dim, batch, cache);
      return;
    }
    QkvRope job;
    job.q_weight = qkv[0].weight->as<const uint16_t>();
    job.k_weight = qkv[1].weight->as<const uint16_t>();
    job.v_weight = qkv[2].weight->as<const uint16_t>();
    job.q = qkv[0].out->as<float>();
    job.k = qkv[1].out->as<float>();
    job.v = qkv[2].out->as<float>();
    job.heads = static_cast<int>(q_heads.dim(1));
    job.cos = cos;
    job.sin = sin;
    job.rotary_dim = rotary_dim;
    job.slot_mapping = batch.slot_mapping;
    job.cache = cache;
    matmul_bf16_few_rows_qkv_rope(x.as<const float>(), rows, x.dim(-1), job,
                                  FewRowsNorm{norm_weight.data, norm_weight.dtype, eps}, stream());
  }

  // Decode: the product adds itself into y (one kernel fewer per residual update).
  void matmul_add(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& scratch,
                  Tensor& y) override {
    MatmulJob job{&weight, bias, &y};
    if (!fits_few_rows_group(x, job)) {
      Ops::matmul_add(x, weight, bias, scratch, y);
      return;
    }
    few_rows_group(x, {&job}, nullptr, true);
  }

  void head_matmul(const Tensor& x, const Tensor& weight, const HeadSlices& slices, bool transposed,
                   Tensor& out) override {
    require_device(x, "head_matmul");
    require_device(weight, "head_matmul");
    DI_CHECK(x.rank == 3 && out.rank == 3 && x.dim(0) == out.dim(0) && x.dim(1) == out.dim(1) &&
                 x.strides[2] == 1 && out.strides[2] == 1,
             "head_matmul: x {} and out {} must be [T, H, *] with contiguous last axes",
             x.shape_string(), out.shape_string());
    cuda::head_matmul(x.as<const float>(), x.strides[0], x.strides[1], device_weight(weight),
                      slices, transposed, x.dim(0), static_cast<int>(x.dim(1)), out.as<float>(),
                      out.strides[0], out.strides[1], stream());
  }

  void copy(const Tensor& source, Tensor& destination) override {
    require_device(source, "copy");
    require_device(destination, "copy");
    check_copy_shapes(source, destination);
    StridedCopy layout;
    int offset = 4 - destination.rank;
    for (int axis = 0; axis < destination.rank; ++axis) {
      auto a = static_cast<size_t>(axis);
      layout.extent[axis + offset] = destination.shape[a];
      layout.from[axis + offset] = source.strides[a];
      layout.to[axis + offset] = destination.strides[a];
    }
    strided_copy(source.as<const float>(), destination.as<float>(), layout, stream());
  }

  void gather_rows(const Tensor& x, const std::vector<int32_t>& rows, Tensor& out) override {
    require_device(x, "gather_rows");
    BackendMemory indices = upload(rows);
    cuda::gather_rows(x.as<const float>(), static_cast<const int32_t*>(indices.get()),
                      static_cast<int64_t>(rows.size()), x.dim(-1), out.as<float>(), stream());
  }

  void add_scaled_rows(Tensor& y, const std::vector<int32_t>& rows,
                       const std::vector<float>& scales, const Tensor& x) override {
    require_device(y, "add_scaled_rows");
    if (rows.empty()) return;
    const EntriesByRow grouped = group_entries_by_row(rows, y);
    BackendMemory indices = upload(grouped.packed);
    BackendMemory factors = upload(scales);
    const auto* at = static_cast<const int32_t*>(indices.get());
    cuda::add_scaled_rows(y.as<float>(),
                          {at, at + grouped.targets, at + grouped.entries_at,
                           static_cast<const float*>(factors.get()), grouped.targets},
                          y.dim(-1), x.as<const float>(), stream());
  }

  void route_experts(const Tensor& router_logits, const std::vector<float>& correction_bias,
                     const ExpertRouting& routing, const std::vector<int32_t>& fixed_experts,
                     int32_t* experts, float* weights) override {
    require_device(router_logits, "route_experts");
    DI_CHECK(router_logits.is_contiguous() && router_logits.dim(-1) == routing.num_experts,
             "route_experts: logits {} must be contiguous rows of {} experts",
             router_logits.shape_string(), routing.num_experts);
    const int64_t tokens = rows_of(router_logits);
    const auto entries = static_cast<size_t>(tokens * routing.experts_per_token);
    BackendMemory bias = correction_bias.empty() ? nullptr : upload(correction_bias);
    BackendMemory fixed = fixed_experts.empty() ? nullptr : upload(fixed_experts);
    BackendMemory chosen = allocate_scratch(2 * entries * sizeof(float));
    auto* chosen_experts = static_cast<int32_t*>(chosen.get());
    auto* chosen_weights = reinterpret_cast<float*>(chosen_experts + entries);
    cuda::route_experts(router_logits.as<const float>(), tokens,
                        static_cast<const float*>(bias.get()),
                        {static_cast<const int32_t*>(fixed.get()), nullptr}, routing,
                        chosen_experts, chosen_weights, stream());
    std::vector<int32_t> both(2 * entries);  // one copy back, one wait
    to_host(both.data(), chosen.get(), both.size() * sizeof(int32_t));
    std::memcpy(experts, both.data(), entries * sizeof(int32_t));
    std::memcpy(weights, both.data() + entries, entries * sizeof(float));
  }

  // Decode batches route, group and run their experts on the device; bigger batches (prompts)
  // take the default path, whose per-expert products run on the tensor cores.
  void routed_experts(const Tensor& x, const Tensor& router_logits, const RoutedExperts& experts,
                      const int32_t* token_ids, Tensor& out) override {
    const DeviceExperts& tables = expert_tables_.find(*this, experts);
    const int64_t tokens = rows_of(x), hidden = x.dim(-1);
    const bool on_device =
        tables.usable && x.is_contiguous() && out.is_contiguous() &&
        router_logits.is_contiguous() &&
        tokens * experts.routing.experts_per_token <= kMaxRoutedPairs &&
        hidden == experts.gate[0]->dim(1) && rows_of(out) == tokens &&
        cuda::routed_experts_fit(hidden, tables.weights.inter, tables.weights.dtype);
    if (!on_device) {  // also any width the device path's chunks do not divide
      prompt_experts(x, router_logits, experts, token_ids, out);
      return;
    }
    const cuda::FixedExperts fixed{tables.token_experts,
                                   tables.token_experts ? token_ids : nullptr};
    BackendMemory workspace = allocate_scratch(
        routed_experts_workspace_bytes(tokens, experts.routing, hidden, tables.weights.inter));
    cuda::routed_experts(x.as<const float>(), router_logits.as<const float>(), tokens, hidden,
                         tables.correction_bias, fixed, experts.routing, tables.weights,
                         precision_ == MatmulPrecision::kBf16, workspace.get(), out.as<float>(),
                         stream());
  }

  // Prompts: the host groups the pairs by expert; FP8 experts share one quantisation of x and
  // one of the activations (grouped_experts.h), others take the default per-expert products.
  void prompt_experts(const Tensor& x, const Tensor& router_logits, const RoutedExperts& experts,
                      const int32_t* token_ids, Tensor& out) {
    const ExpertGroups groups = group_routed_pairs(x, router_logits, experts, token_ids);
    if (groups.rows.empty()) return;
    const bool grouped = precision_ == MatmulPrecision::kBf16 && x.is_contiguous() &&
                         fp8_grouped_experts_fit(experts, x.dim(1)) &&
                         fp8_grouped_experts(*this, *lt_, x, experts, groups, out, stream());
    if (!grouped) run_expert_groups(x, experts, groups, out);
  }

  void embedding(const Tensor& table, const int32_t* ids, Tensor& out) override {
    require_device(table, "embedding");
    cuda::embedding(table.data, table.dtype, table.dim(1), ids, rows_of(out), out.as<float>(),
                    table.dim(0), stream());
  }

  void rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& y) override {
    require_device(x, "rmsnorm");
    require_device(weight, "rmsnorm");
    int64_t x_stride = uniform_row_stride(x), y_stride = uniform_row_stride(y);
    DI_CHECK(x_stride > 0 && y_stride > 0 && weight.numel() == x.dim(-1),
             "rmsnorm: x {} / y {} must be evenly spaced rows of weight {}", x.shape_string(),
             y.shape_string(), weight.shape_string());
    cuda::rmsnorm(x.as<const float>(), x_stride, weight.data, weight.dtype, rows_of(x), x.dim(-1),
                  eps, y.as<float>(), y_stride, stream());
  }

  void add(Tensor& y, const Tensor& x) override {
    cuda::add(y.as<float>(), x.as<const float>(), y.numel(), stream());
  }

  void rope(Tensor& x, const float* cos, const float* sin, int rotary_dim,
            bool interleaved) override {
    DI_CHECK(x.rank == 3 && x.strides[2] == 1 && rotary_dim <= x.dim(2),
             "rope: x {} must be [tokens, heads, head_dim] with contiguous heads",
             x.shape_string());
    cuda::rope(x.as<float>(), {x.strides[0], x.strides[1]}, cos, sin, x.dim(0),
               static_cast<int>(x.dim(1)), rotary_dim, interleaved, stream());
  }

  void hc_pre(const Tensor& streams, const HyperConnection& hc, Tensor* mix,
              Tensor& collapsed) override {
    require_device(streams, "hc_pre");
    const auto mixes = static_cast<int>(hc.fn->dim(0));
    BackendMemory scratch =
        allocate_scratch(static_cast<size_t>(cuda::hc_pre_scratch_floats(
                             collapsed.dim(0), collapsed.dim(-1), hc.streams, mixes)) *
                         sizeof(float));
    cuda::hc_pre(streams.as<const float>(), collapsed.dim(0), collapsed.dim(-1),
                 hc.fn->as<const float>(), hc.base->as<const float>(), hc.scale->as<const float>(),
                 hc.streams, mixes, hc.sinkhorn_iterations, hc.eps, hc.norm_eps,
                 static_cast<float*>(scratch.get()), mix ? mix->as<float>() : nullptr,
                 collapsed.as<float>(), stream());
  }

  void hc_post(const Tensor& out, const Tensor& mix, Tensor& streams) override {
    const int64_t width = out.dim(-1);
    cuda::hc_post(out.as<const float>(), mix.as<const float>(), out.dim(0), width,
                  static_cast<int>(streams.numel() / (out.dim(0) * width)), streams.as<float>(),
                  stream());
  }

  void write_records(const Tensor& values, const AttentionBatch& batch,
                     const PagedRecords& records) override {
    DeviceRecords device = device_records(records);
    cuda::write_records(values.as<const float>(), values.dim(0), values.dim(-1), device_rows(batch),
                        device.view, stream());
  }

  void compress_windows(const PagedRecords& inputs, const Compressor& compressor,
                        const int32_t* windows, int64_t count, const float* cos, const float* sin,
                        const EntryStripes& entries) override {
    DeviceRecords device_inputs = device_records(inputs);
    DeviceRecords device_entries = device_records(entries.records);
    cuda::compress_windows(device_inputs.view, compressor,
                           compressor.position_bias->as<const float>(),
                           compressor.norm->as<const float>(), windows, count, cos, sin,
                           {device_entries.view, entries.stripe, entries.rate}, stream());
  }

  void index_select(const Tensor& queries, const Tensor& head_weights, float scale,
                    const AttentionBatch& batch, const EntryStripes& entries, int64_t key_offset,
                    int k, int32_t* selected) override {
    DeviceRecords device_entries = device_records(entries.records);
    const int64_t max_visible = batch.max_context_len / entries.rate;
    const int64_t tokens = queries.dim(0);
    BackendMemory scores = allocate_scratch(
        static_cast<size_t>(tokens * std::max<int64_t>(max_visible, 1)) * sizeof(float));
    cuda::index_select(queries.as<const float>(), head_weights.as<const float>(), tokens,
                       static_cast<int>(queries.dim(1)), static_cast<int>(queries.dim(2)), scale,
                       device_rows(batch), {device_entries.view, entries.stripe, entries.rate},
                       key_offset, k, max_visible, precision_ == MatmulPrecision::kBf16,
                       static_cast<float*>(scores.get()), selected, stream());
  }

  void sparse_attention(const Tensor& q, const AttentionBatch& batch,
                        const PagedKvView& window_cache, int window, const EntryStripes& entries,
                        const int32_t* selected, int k, const Tensor& sinks, float scale,
                        Tensor& out) override {
    DI_CHECK(window_cache.dtype == DType::kF32 && window_cache.key_stride() == q.dim(2),
             "sparse_attention: the window cache must hold f32 rows of {}", q.dim(2));
    DeviceRecords device_entries;
    if (entries.rate > 0) device_entries = device_records(entries.records);
    const int64_t entry_keys =
        selected ? k : (entries.rate > 0 ? batch.max_context_len / entries.rate : 0);
    const int64_t workspace_floats = cuda::sparse_attention_workspace_floats(
        q.dim(0), static_cast<int>(q.dim(1)), static_cast<int>(q.dim(2)), window + entry_keys);
    BackendMemory workspace;
    if (workspace_floats > 0)
      workspace = allocate_scratch(static_cast<size_t>(workspace_floats) * sizeof(float));
    cuda::sparse_attention(
        q.as<const float>(), q.dim(0), static_cast<int>(q.dim(1)), static_cast<int>(q.dim(2)),
        device_rows(batch), batch.block_tables, batch.max_blocks_per_seq, window_cache.key_floats(),
        window_cache.block_size, window, {device_entries.view, entries.stripe, entries.rate},
        selected, k, window + entry_keys, sinks.as<const float>(), scale,
        precision_ == MatmulPrecision::kBf16, out.as<float>(), static_cast<float*>(workspace.get()),
        stream());
  }

  void clamped_silu_mul(const Tensor& gate, const Tensor& up, float limit, Tensor& out) override {
    cuda::clamped_silu_mul(gate.as<const float>(), up.as<const float>(), limit, out.as<float>(),
                           out.numel(), stream());
  }

  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    cuda::silu_mul(gate.as<const float>(), up.as<const float>(), out.as<float>(), out.numel(),
                   stream());
  }

  void gelu_tanh_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    cuda::gelu_tanh_mul(gate.as<const float>(), up.as<const float>(), out.as<float>(), out.numel(),
                        stream());
  }

  void kv_write(const Tensor& k, const Tensor* v, const AttentionBatch& batch,
                const PagedKvView& cache) override {
    require_device(k, "kv_write");
    cuda::kv_write(k.as<const float>(), v ? v->as<const float>() : nullptr, batch.slot_mapping,
                   k.dim(0), cache, stream());
  }

  void rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const float* cos, const float* sin,
                     int rotary_dim, const AttentionBatch& batch,
                     const PagedKvView& cache) override {
    bool fused = q.is_contiguous() && k.is_contiguous() && v.is_contiguous() && q.rank == 3 &&
                 k.rank == 3 && q.dim(2) == cache.key_dim && k.dim(1) == cache.num_kv_heads &&
                 k.dim(2) == cache.key_dim && !cache.values_in_keys &&
                 cache.value_dim == cache.key_dim && rotary_dim % 2 == 0;
    if (!fused) {
      Ops::rope_kv_write(q, k, v, cos, sin, rotary_dim, batch, cache);
      return;
    }
    require_device(q, "rope_kv_write");
    cuda::rope_kv_write(q.as<float>(), static_cast<int>(q.dim(1)), k.as<float>(),
                        v.as<const float>(), cos, sin, rotary_dim, batch.slot_mapping, k.dim(0),
                        cache, stream());
  }

  void kv_read_keys(const PagedKvView& cache, const int32_t* block_table, int64_t count,
                    Tensor& keys) override {
    DI_CHECK(keys.numel() >= count * cache.key_stride(),
             "kv_read_keys: output {} holds fewer than {} tokens", keys.shape_string(), count);
    cuda::kv_read_keys(cache, block_table, count, keys.as<float>(), stream());
  }

  void paged_attention(const Tensor& q, const AttentionBatch& batch, const PagedKvView& cache,
                       float scale, int window, Tensor& out) override {
    require_device(q, "paged_attention");
    DI_CHECK(q.is_contiguous() && out.is_contiguous(),
             "paged_attention: q {} and out {} must be contiguous", q.shape_string(),
             out.shape_string());
    int64_t rows = q.dim(0);
    int heads = static_cast<int>(q.dim(1));
    // Mostly prompt rows (4 or more per sequence on average): tensor-core tiles.
    if (rows >= 4 * int64_t{batch.num_seqs} && flash_attention_supports(heads, cache)) {
      flash_attention(q.as<const float>(), rows, heads, batch, cache, scale, window,
                      out.as<float>(), stream());
      return;
    }
    // Split records go to the workspace set aside once; grouped_attention fails clearly if a
    // split choice ever needed more (a test checks every choice against the limit).
    const int splits = paged_attention_splits(rows, cache.num_kv_heads, batch.max_context_len);
    const bool split = splits > 1;
    cuda::paged_attention(q.as<const float>(), rows, heads, batch, cache, scale, window,
                          out.as<float>(), stream(),
                          SplitKeys{splits, static_cast<unsigned*>(attention_arrivals_.get()),
                                    kAttentionArrivalSlots},
                          split ? static_cast<float*>(attention_workspace_.get()) : nullptr,
                          split ? paged_attention_workspace_limit_floats() : 0);
  }

  void sample_rows(const Tensor& logits, const std::vector<TokenDraw>& draws,
                   DrawnToken* out) override {
    require_device(logits, "sample_rows");
    DI_CHECK(logits.rank == 2 && logits.strides[1] == 1 && logits.strides[0] >= logits.dim(-1),
             "sample_rows: logits {} must be rows of adjacent values", logits.shape_string());
    for (const TokenDraw& draw : draws) {
      DI_CHECK(draw.row >= 0 && draw.row < rows_of(logits), "sample_rows: row {} of {}", draw.row,
               rows_of(logits));
    }
    if (draws.empty()) return;
    size_t draw_bytes = draws.size() * sizeof(TokenDraw);
    size_t out_bytes = draws.size() * sizeof(DrawnToken);
    BackendMemory device_draws = allocate_scratch(draw_bytes);
    BackendMemory device_out = allocate_scratch(out_bytes);
    to_backend(device_draws.get(), draws.data(), draw_bytes);
    cuda::sample_rows(logits.as<const float>(), logits.dim(-1), logits.strides[0],
                      static_cast<const TokenDraw*>(device_draws.get()),
                      static_cast<int64_t>(draws.size()),
                      static_cast<DrawnToken*>(device_out.get()), stream());
    to_host(out, device_out.get(), out_bytes);
  }

  // The masks' bits go over in one copy, after the rows' places: the bits of a 151 k
  // vocabulary are 19 KB a row, against 600 KB for the row itself read back to the host.
  void mask_rows(Tensor& logits, const std::vector<RowMask>& masks) override {
    require_device(logits, "mask_rows");
    const int64_t vocab = logits.dim(-1);
    DI_CHECK(logits.rank == 2 && logits.strides[1] == 1 && logits.strides[0] >= vocab,
             "mask_rows: logits {} must be rows of adjacent values", logits.shape_string());
    if (masks.empty()) return;
    std::vector<cuda::DeviceRowMask> places;
    std::vector<uint64_t> words;
    for (const RowMask& mask : masks) {
      DI_CHECK(mask.row >= 0 && mask.row < rows_of(logits) && mask.bits != nullptr,
               "mask_rows: row {} of {}", mask.row, rows_of(logits));
      const int64_t marked = std::clamp<int64_t>(mask.marked, 0, vocab);
      places.push_back({mask.row, static_cast<int64_t>(words.size()), marked});
      words.insert(words.end(), mask.bits, mask.bits + (marked + 63) / 64);
    }
    const size_t place_bytes = places.size() * sizeof(cuda::DeviceRowMask);
    BackendMemory device = allocate_scratch(place_bytes + words.size() * sizeof(uint64_t));
    auto* base = static_cast<std::byte*>(device.get());
    to_backend(base, places.data(), place_bytes);
    to_backend(base + place_bytes, words.data(), words.size() * sizeof(uint64_t));
    cuda::mask_rows(logits.as<float>(), vocab, logits.strides[0],
                    reinterpret_cast<const cuda::DeviceRowMask*>(base),
                    reinterpret_cast<const uint64_t*>(base + place_bytes),
                    static_cast<int64_t>(places.size()), stream());
  }

 private:
  // A contiguous tensor shaped as `tensor` in new device memory, holding its values if `fill`.
  Tensor packed_copy(const Tensor& tensor, BackendMemory& memory, bool fill) {
    memory = allocate_scratch(static_cast<size_t>(tensor.numel()) * sizeof(float));
    Tensor packed = tensor;
    packed.data = memory.get();
    int64_t stride = 1;
    for (int axis = tensor.rank - 1; axis >= 0; --axis) {
      packed.strides[static_cast<size_t>(axis)] = stride;
      stride *= tensor.shape[static_cast<size_t>(axis)];
    }
    if (fill) copy(tensor, packed);
    return packed;
  }
  // The stream, with this thread's current device made ours first: the engine may run
  // forwards on its step thread (--async-scheduling), whose current device starts at 0.
  cudaStream_t stream() const {
    thread_local int current = -1;
    if (current != device_) {
      check_cuda(cudaSetDevice(device_), "set device");
      current = device_;
    }
    return stream_.get();
  }

  // PagedRecords with its pointer arrays written to the device (kept alive with it) in a way
  // a recorded decode step replays.
  struct DeviceRecords {
    BackendMemory pointers;  // layers, then tables
    cuda::DeviceRecords view;
  };
  DeviceRecords device_records(const PagedRecords& records) {
    DI_CHECK(records.layers.size() == records.tables.size(),
             "paged records: {} layers and {} tables", records.layers.size(),
             records.tables.size());
    const size_t count = records.layers.size();
    std::vector<uintptr_t> addresses;
    for (float* layer : records.layers) addresses.push_back(reinterpret_cast<uintptr_t>(layer));
    for (const int32_t* table : records.tables)
      addresses.push_back(reinterpret_cast<uintptr_t>(table));
    DeviceRecords device;
    device.pointers = allocate_scratch(std::max<size_t>(addresses.size(), 1) * sizeof(uintptr_t));
    auto* stored = static_cast<uintptr_t*>(device.pointers.get());
    cuda::store_addresses(addresses.data(), static_cast<int64_t>(addresses.size()), stored,
                          stream());
    device.view = {reinterpret_cast<float* const*>(stored),
                   reinterpret_cast<const int32_t* const*>(stored + count),
                   static_cast<int>(count),
                   records.max_blocks_per_seq,
                   records.block_size,
                   records.row,
                   records.offset};
    return device;
  }
  static cuda::DeviceRows device_rows(const AttentionBatch& batch) {
    return {batch.query_start, batch.context_lens, batch.num_seqs, batch.first_positions};
  }

  template <typename T>
  BackendMemory upload(const std::vector<T>& values) {
    BackendMemory memory = allocate_scratch(values.size() * sizeof(T));
    to_backend(memory.get(), values.data(), values.size() * sizeof(T));
    return memory;
  }

  // Up to kMaxFewRowsProducts bf16 products of x in one launch (each fits_few_rows_group),
  // then their biases.
  void few_rows_group(const Tensor& x, const std::vector<const MatmulJob*>& group,
                      const FewRowsNorm* norm, bool accumulate) {
    FewRowsProduct products[kMaxFewRowsProducts];
    for (size_t i = 0; i < group.size(); ++i) {
      const MatmulJob& job = *group[i];
      products[i] = {job.weight->as<const uint16_t>(), job.weight->dim(0), job.out->as<float>(),
                     accumulate};
    }
    matmul_bf16_few_rows(x.as<const float>(), products, static_cast<int>(group.size()), rows_of(x),
                         x.dim(-1), stream(), norm);
    for (const MatmulJob* job : group) {
      if (job->bias)
        add_bias(job->out->as<float>(), device_weight(*job->bias), rows_of(x), job->weight->dim(0),
                 stream());
    }
  }

  bool fits_few_rows_group(const Tensor& x, const MatmulJob& job) const {
    const Tensor& w = *job.weight;
    return !job.input && w.dtype == DType::kBF16 && w.device == Device::kCuda &&
           x.device == Device::kCuda && x.is_contiguous() && job.out->is_contiguous() &&
           rows_of(x) <= kFewRowsHalf && x.dim(-1) == w.dim(1) && w.dim(1) % 8 == 0 &&
           job.out->dim(-1) == w.dim(0) && rows_of(*job.out) == rows_of(x) &&
           (!job.bias || job.bias->device == Device::kCuda);
  }

  // The fastest kernel this weight and row count allow: decode rows stream bf16 and FP8
  // weights once through registers; bf16 and FP8 prompts go to cuBLASLt's tensor-core kernels
  // (FP8 with x quantised to e4m3 per 128 columns, as DeepSeek serves them); everything else
  // (f32 weights, f32 precision, shapes cuBLASLt refuses) takes the tiled kernel.
  void product(const float* x, const Tensor& weight, int64_t rows, float* y) {
    int64_t n = weight.dim(0);
    int64_t k = weight.dim(1);
    const bool fp8 = fp8_block_scaled(weight);
    const bool half = weight.dtype == DType::kBF16 || weight.dtype == DType::kF16;
    if (rows <= kFewRowsHalf && weight.dtype == DType::kBF16 && k % 8 == 0) {
      matmul_bf16_few_rows(x, weight.as<const uint16_t>(), rows, n, k, y, stream());
    } else if (rows <= kFewRowsHalf && weight.dtype == DType::kF16 && k % 8 == 0) {
      matmul_f16_few_rows(x, weight.as<const uint16_t>(), rows, n, k, y, stream());
    } else if (rows <= kFewRows && fp8 && k % 16 == 0) {
      matmul_fp8_few_rows(x, weight.as<const uint8_t>(), weight.block_scales->data, rows, n, k, y,
                          stream());
    } else if (fp8 && precision_ == MatmulPrecision::kBf16 && LtMatmul::fp8_fits(n, k) &&
               fp8_on_lt(x, weight, rows, y)) {
      // done on the tensor cores
    } else if (half && k % 8 == 0 && precision_ == MatmulPrecision::kBf16) {
      BackendMemory rounded = allocate_scratch(static_cast<size_t>(rows * k) * 2);
      lt_->run(x, static_cast<uint16_t*>(rounded.get()), weight.as<const uint16_t>(), weight.dtype,
               rows, n, k, y, stream());
    } else {
      matmul_tiled(x, device_weight(weight), rows, n, y, stream());
    }
  }

  bool fp8_on_lt(const float* x, const Tensor& weight, int64_t rows, float* y) {
    const int64_t n = weight.dim(0), k = weight.dim(1);
    BackendMemory scratch = allocate_scratch(LtMatmul::fp8_scratch_bytes(rows, n, k));
    return lt_->run_fp8(x, scratch.get(), weight.as<const uint8_t>(), weight.block_scales->data,
                        rows, n, k, y, stream());
  }

  // Split decode attention's per-(row, KV head) counters: the last split to finish merges.
  static constexpr int64_t kAttentionArrivalSlots = 16384;

  int device_;
  MatmulPrecision precision_;
  std::string name_;
  std::shared_ptr<CUstream_st> stream_;
  std::unique_ptr<LtMatmul> lt_;
  ExpertTables expert_tables_;
  BackendMemory attention_arrivals_;
  BackendMemory attention_workspace_;  // paged_attention_workspace_limit_floats()
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(int device, MatmulPrecision precision) {
  return std::make_unique<CudaOps>(device, precision);
}

}  // namespace deepinfer::cuda

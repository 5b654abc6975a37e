// Products on the tensor cores through cuBLASLt, for prompts: x rounded to the weights'
// 16-bit type, plans cached per shape.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"

namespace deepinfer::cuda {
namespace {

// x rounded to the weight's 16-bit type, the activations cuBLASLt multiplies.
__global__ void to_half_kernel(const float* x, void* out, bool bf16, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (bf16) {
      static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(x[i]);
    } else {
      static_cast<__half*>(out)[i] = __float2half_rn(x[i]);
    }
  }
}

// x quantised to e4m3 for FP8 products, one warp per (row, 128 columns): each group's largest
// magnitude maps to e4m3's largest finite value (448), its scale is kept in the row's segment
// (see Fp8Segments).
__global__ void to_fp8_kernel(const float* x, Fp8Segments segments, int64_t k, __nv_fp8_e4m3* out,
                              float* scales) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t groups = k / kFp8Group;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t item = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
       item < segments.rows * groups; item += warps) {
    const int64_t row = item / groups;
    const int64_t group = item % groups;
    const int64_t source =
        segments.source ? segments.source[row] : (row < segments.real_rows ? row : int64_t{-1});
    int64_t first = 0, count = segments.rows;
    if (segments.segment_of_row) {
      const int segment = segments.segment_of_row[row];
      first = segments.segment_first[segment];
      count = segments.segment_first[segment + 1] - first;
    }
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (source >= 0) v = reinterpret_cast<const float4*>(x + source * k + group * kFp8Group)[lane];
    float largest = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    for (int offset = 16; offset > 0; offset /= 2)
      largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
    const float scale = largest > 0.0f ? largest / 448.0f : 1.0f;
    const float inverse = 1.0f / scale;
    __nv_fp8x4_e4m3 packed(make_float4(v.x * inverse, v.y * inverse, v.z * inverse, v.w * inverse));
    reinterpret_cast<__nv_fp8x4_e4m3*>(out + row * k + group * kFp8Group)[lane] = packed;
    if (lane == 0) scales[first * groups + group * count + (row - first)] = scale;
  }
}

// A weight's 128 x 128 scales as cuBLASLt reads them: rows padded to a multiple of 4 blocks
// and 16-byte aligned, copied into `scratch` when the stored ones are not.
struct WeightScales {
  int64_t block_rows, cols, stride;
  bool padded;
  const float* pointer;

  WeightScales(const float* stored, int64_t n, int64_t k, void* scratch)
      : block_rows((n + 127) / 128), cols(k / kFp8Group), stride((cols + 3) / 4 * 4) {
    padded = stride != cols || reinterpret_cast<uintptr_t>(stored) % 16 != 0;
    pointer = padded ? static_cast<const float*>(scratch) : stored;
  }
  static size_t bytes(int64_t n, int64_t k) {
    return static_cast<size_t>((n + 127) / 128 * ((k / kFp8Group + 3) / 4 * 4)) * sizeof(float);
  }
  void fill(const float* stored, cudaStream_t stream) const {
    if (!padded) return;
    auto* target = const_cast<float*>(pointer);
    const auto row_bytes = static_cast<size_t>(cols) * sizeof(float);
    const auto stride_bytes = static_cast<size_t>(stride) * sizeof(float);
    check_cuda(cudaMemsetAsync(target, 0, static_cast<size_t>(block_rows) * stride_bytes, stream),
               "clearing FP8 weight scales");
    check_cuda(cudaMemcpy2DAsync(target, stride_bytes, stored, row_bytes, row_bytes,
                                 static_cast<size_t>(block_rows), cudaMemcpyDeviceToDevice, stream),
               "padding FP8 weight scales");
  }
};

// Where run_fp8's pieces sit in its scratch, each on a 256-byte boundary: x in e4m3 and its
// scales, the weight's scales as cuBLASLt reads them, and y for the padded rows when the row
// count is not a multiple of kFp8RowMultiple.
struct Fp8Scratch {
  int64_t rows_padded;
  size_t x_scales, weight_scales, y_padded, total;  // byte offsets; x in e4m3 at 0

  Fp8Scratch(int64_t rows, int64_t n, int64_t k) {
    auto aligned = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
    rows_padded = (rows + kFp8RowMultiple - 1) / kFp8RowMultiple * kFp8RowMultiple;
    x_scales = aligned(static_cast<size_t>(rows_padded * k));
    weight_scales = x_scales + aligned(static_cast<size_t>(rows_padded * (k / kFp8Group)) * 4);
    y_padded = weight_scales + aligned(WeightScales::bytes(n, k));
    total = y_padded + aligned(static_cast<size_t>(rows_padded * n) * 4);
  }
};

const char* lt_type_name(cudaDataType_t type) {
  return type == CUDA_R_16BF ? "bf16" : type == CUDA_R_16F ? "f16" : "fp8";
}

void check_lt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt {}: status {}", what, int(status));
}

}  // namespace

// A product shape's descriptors and algorithm, made once: the heuristic query alone costs
// tens of microseconds of host time, and a 64-way decode step runs 224 such products.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};

  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

struct LtMatmul::Impl {
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace{size_t{32} << 20};
  // Keyed by (operand type, rows, n, k); prompt chunks bring many row counts, so the cache is
  // bounded.
  std::map<std::tuple<cudaDataType_t, int64_t, int64_t, int64_t>, std::unique_ptr<LtPlan>> plans;
  static constexpr size_t kMaxPlans = 4096;

  // FP8 plans take the scales' pointers (the heuristic looks at them; each product sets its
  // own); none when cuBLASLt has no algorithm for the FP8 product on this GPU.
  const LtPlan* plan(cudaDataType_t type, int64_t rows, int64_t n, int64_t k,
                     const float* weight_scales = nullptr, const float* x_scales = nullptr);
  void multiply(const LtPlan& p, const void* weight, const void* x, float* y, cudaStream_t stream);
};

// Column-major view: D (n x rows) = W^T-as-stored (k x n, transposed) * x^T (k x rows).
// FP8 operands carry DeepSeek-style scales: 128 x 128 blocks on the weight, 1 x 128 groups on
// x, their pointers set per product.
const LtPlan* LtMatmul::Impl::plan(cudaDataType_t type, int64_t rows, int64_t n, int64_t k,
                                   const float* weight_scales, const float* x_scales) {
  const auto key = std::make_tuple(type, rows, n, k);
  if (auto found = plans.find(key); found != plans.end()) return found->second.get();
  auto made = std::make_unique<LtPlan>();
  check_lt(cublasLtMatmulDescCreate(&made->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  cublasOperation_t transpose = CUBLAS_OP_T;
  check_lt(cublasLtMatmulDescSetAttribute(made->op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                          sizeof(transpose)),
           "transa");
  if (type == CUDA_R_8F_E4M3) {
    int32_t weight_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    int32_t x_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    check_lt(cublasLtMatmulDescSetAttribute(made->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                            &weight_mode, sizeof(weight_mode)),
             "weight scale mode");
    check_lt(cublasLtMatmulDescSetAttribute(made->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &x_mode,
                                            sizeof(x_mode)),
             "x scale mode");
    check_lt(cublasLtMatmulDescSetAttribute(made->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                            &weight_scales, sizeof(weight_scales)),
             "weight scales");
    check_lt(cublasLtMatmulDescSetAttribute(made->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                            &x_scales, sizeof(x_scales)),
             "x scales");
  }
  auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  check_lt(cublasLtMatrixLayoutCreate(&made->a, type, u(k), u(n), k), "layout a");
  check_lt(cublasLtMatrixLayoutCreate(&made->b, type, u(k), u(rows), k), "layout b");
  check_lt(cublasLtMatrixLayoutCreate(&made->d, CUDA_R_32F, u(n), u(rows), n), "layout d");
  cublasLtMatmulPreference_t preference = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&preference), "preference");
  size_t workspace_bytes = workspace.bytes();
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  cublasStatus_t status =
      cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof(workspace_bytes));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(handle, made->op, made->a, made->b, made->d, made->d,
                                            preference, 1, &heuristic, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  if (type == CUDA_R_8F_E4M3 && (status != CUBLAS_STATUS_SUCCESS || found == 0)) {
    plans.emplace(key, nullptr);  // asked once per shape
    return nullptr;
  }
  check_lt(status, "heuristic");
  if (found == 0)
    fail("cuBLASLt: no algorithm for a {} {}x{}x{} product", lt_type_name(type), rows, n, k);
  made->algo = heuristic.algo;
  if (plans.size() > kMaxPlans) plans.clear();
  return (plans[key] = std::move(made)).get();
}

LtMatmul::LtMatmul() : impl_(std::make_unique<Impl>()) {
  check_lt(cublasLtCreate(&impl_->handle), "create");
}

LtMatmul::~LtMatmul() {
  impl_->plans.clear();
  if (impl_->handle) cublasLtDestroy(impl_->handle);
}

void LtMatmul::Impl::multiply(const LtPlan& p, const void* weight, const void* x, float* y,
                              cudaStream_t stream) {
  const float one = 1.0f, zero = 0.0f;
  check_lt(cublasLtMatmul(handle, p.op, &one, weight, p.a, x, p.b, &zero, y, p.d, y, p.d, &p.algo,
                          workspace.data(), workspace.bytes(), stream),
           "matmul");
}

void LtMatmul::run(const float* x, uint16_t* x_rounded, const uint16_t* weight, DType dtype,
                   int64_t rows, int64_t n, int64_t k, float* y, cudaStream_t stream) {
  if (dtype != DType::kBF16 && dtype != DType::kF16)
    fail("cuBLASLt products take bf16 or f16 weights, not {}", dtype_name(dtype));
  const bool bf16 = dtype == DType::kBF16;
  const int64_t count = rows * k;
  auto blocks = static_cast<unsigned>(std::min<int64_t>((count + 255) / 256, 65535));
  to_half_kernel<<<blocks, 256, 0, stream>>>(x, x_rounded, bf16, count);
  check_launch("rounding x for cuBLASLt");
  impl_->multiply(*impl_->plan(bf16 ? CUDA_R_16BF : CUDA_R_16F, rows, n, k), weight, x_rounded, y,
                  stream);
}

bool LtMatmul::fp8_fits(int64_t n, int64_t k) {
  return k % kFp8Group == 0 && n % 16 == 0;
}

size_t LtMatmul::fp8_scratch_bytes(int64_t rows, int64_t n, int64_t k) {
  return Fp8Scratch(rows, n, k).total;
}

bool LtMatmul::run_fp8(const float* x, void* scratch, const uint8_t* weight,
                       const float* weight_scales, int64_t rows, int64_t n, int64_t k, float* y,
                       cudaStream_t stream) {
  if (!fp8_fits(n, k))
    fail("cuBLASLt FP8 products need k % 128 == 0 and n % 16 == 0, not {} x {}", n, k);
  const Fp8Scratch layout(rows, n, k);
  auto* base = static_cast<char*>(scratch);
  auto* x_scales = reinterpret_cast<float*>(base + layout.x_scales);
  void* scale_scratch = base + layout.weight_scales;
  if (!fp8_ready(layout.rows_padded, n, k, weight_scales, x_scales, scale_scratch)) return false;
  quantise_fp8(x, Fp8Segments{nullptr, nullptr, nullptr, layout.rows_padded, rows}, k, base,
               x_scales, stream);
  float* out = layout.rows_padded == rows ? y : reinterpret_cast<float*>(base + layout.y_padded);
  multiply_fp8(base, x_scales, layout.rows_padded, weight, weight_scales, n, k, out, scale_scratch,
               stream);
  if (out != y) {
    check_cuda(cudaMemcpyAsync(y, out, static_cast<size_t>(rows * n) * sizeof(float),
                               cudaMemcpyDeviceToDevice, stream),
               "copying an FP8 product's rows");
  }
  return true;
}

void LtMatmul::quantise_fp8(const float* x, const Fp8Segments& segments, int64_t k, void* out,
                            float* scales, cudaStream_t stream) {
  const int64_t items = segments.rows * (k / kFp8Group);
  auto grid = static_cast<unsigned>(std::min<int64_t>((items + 7) / 8, 65535));
  if (items == 0) return;
  to_fp8_kernel<<<grid, 256, 0, stream>>>(x, segments, k, static_cast<__nv_fp8_e4m3*>(out), scales);
  check_launch("quantising x for cuBLASLt");
}

size_t LtMatmul::fp8_weight_scale_bytes(int64_t n, int64_t k) {
  return WeightScales::bytes(n, k);
}

bool LtMatmul::fp8_ready(int64_t rows, int64_t n, int64_t k, const float* weight_scales,
                         const float* x_scales, void* scale_scratch) {
  const WeightScales scales(weight_scales, n, k, scale_scratch);
  return impl_->plan(CUDA_R_8F_E4M3, rows, n, k, scales.pointer, x_scales) != nullptr;
}

bool LtMatmul::multiply_fp8(const void* x_fp8, const float* x_scales, int64_t rows,
                            const uint8_t* weight, const float* weight_scales, int64_t n, int64_t k,
                            float* y, void* scale_scratch, cudaStream_t stream) {
  if (!fp8_fits(n, k) || rows % kFp8RowMultiple != 0)
    fail(
        "cuBLASLt FP8 products need k % 128 == 0, n % 16 == 0 and rows in eights, not {} x {} x {}",
        rows, n, k);
  const WeightScales scales(weight_scales, n, k, scale_scratch);
  const LtPlan* p = impl_->plan(CUDA_R_8F_E4M3, rows, n, k, scales.pointer, x_scales);
  if (!p) return false;
  scales.fill(weight_scales, stream);
  check_lt(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                          &scales.pointer, sizeof(scales.pointer)),
           "weight scales");
  check_lt(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales,
                                          sizeof(x_scales)),
           "x scales");
  impl_->multiply(*p, weight, x_fp8, y, stream);
  return true;
}

}  // namespace deepinfer::cuda

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

// x quantised to e4m3 for an FP8 product, one warp per (row, 128 columns): each group's
// largest magnitude maps to e4m3's largest finite value (448), its scale is kept beside it
// (token-major [k / 128][rows_padded], the layout cuBLASLt reads 1 x 128 scales in). Rows
// from `rows` to `rows_padded` are zeros.
__global__ void to_fp8_kernel(const float* x, __nv_fp8_e4m3* out, float* scales, int64_t rows,
                              int64_t k, int64_t rows_padded) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t groups = k / kFp8Group;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t item = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
       item < rows_padded * groups; item += warps) {
    const int64_t row = item / groups;
    const int64_t group = item % groups;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row < rows) v = reinterpret_cast<const float4*>(x + row * k + group * kFp8Group)[lane];
    float largest = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    for (int offset = 16; offset > 0; offset /= 2)
      largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
    const float scale = largest > 0.0f ? largest / 448.0f : 1.0f;
    const float inverse = 1.0f / scale;
    __nv_fp8x4_e4m3 packed(make_float4(v.x * inverse, v.y * inverse, v.z * inverse, v.w * inverse));
    reinterpret_cast<__nv_fp8x4_e4m3*>(out + row * k + group * kFp8Group)[lane] = packed;
    if (lane == 0) scales[group * rows_padded + row] = scale;
  }
}

// Where run_fp8's pieces sit in its scratch, each on a 256-byte boundary: x in e4m3 and its
// scales; the weight's scales with each row padded to a multiple of 4 blocks (cuBLASLt's
// stride rule for 128 x 128 scales) when the stored ones are not; y for the padded rows when
// the row count is not a multiple of kFp8RowMultiple.
struct Fp8Scratch {
  int64_t rows_padded, scale_cols, scale_stride;
  size_t x_scales, weight_scales, y_padded, total;  // byte offsets; x in e4m3 at 0

  Fp8Scratch(int64_t rows, int64_t n, int64_t k) {
    auto aligned = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
    rows_padded = (rows + kFp8RowMultiple - 1) / kFp8RowMultiple * kFp8RowMultiple;
    scale_cols = k / kFp8Group;
    scale_stride = (scale_cols + 3) / 4 * 4;
    x_scales = aligned(static_cast<size_t>(rows_padded * k));
    weight_scales = x_scales + aligned(static_cast<size_t>(rows_padded * scale_cols) * 4);
    y_padded = weight_scales + aligned(static_cast<size_t>((n + 127) / 128 * scale_stride) * 4);
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
  auto* x_fp8 = reinterpret_cast<__nv_fp8_e4m3*>(base);
  auto* x_scales = reinterpret_cast<float*>(base + layout.x_scales);
  const bool pad_scales = layout.scale_stride != layout.scale_cols ||
                          reinterpret_cast<uintptr_t>(weight_scales) % 16 != 0;
  const float* scales =
      pad_scales ? reinterpret_cast<float*>(base + layout.weight_scales) : weight_scales;
  const LtPlan* p = impl_->plan(CUDA_R_8F_E4M3, layout.rows_padded, n, k, scales, x_scales);
  if (!p) return false;
  const int64_t items = layout.rows_padded * layout.scale_cols;
  auto grid = static_cast<unsigned>(std::min<int64_t>((items + 7) / 8, 65535));
  to_fp8_kernel<<<grid, 256, 0, stream>>>(x, x_fp8, x_scales, rows, k, layout.rows_padded);
  check_launch("quantising x for cuBLASLt");
  if (pad_scales) {
    const auto row_bytes = static_cast<size_t>(layout.scale_cols) * sizeof(float);
    const auto block_rows = static_cast<size_t>((n + 127) / 128);
    auto* padded = const_cast<float*>(scales);
    check_cuda(cudaMemsetAsync(
                   padded, 0, block_rows * static_cast<size_t>(layout.scale_stride) * sizeof(float),
                   stream),
               "clearing FP8 weight scales");
    check_cuda(cudaMemcpy2DAsync(padded, static_cast<size_t>(layout.scale_stride) * sizeof(float),
                                 weight_scales, row_bytes, row_bytes, block_rows,
                                 cudaMemcpyDeviceToDevice, stream),
               "padding FP8 weight scales");
  }
  check_lt(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scales,
                                          sizeof(scales)),
           "weight scales");
  const float* x_scale_pointer = x_scales;
  check_lt(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                          &x_scale_pointer, sizeof(x_scale_pointer)),
           "x scales");
  float* out = layout.rows_padded == rows ? y : reinterpret_cast<float*>(base + layout.y_padded);
  impl_->multiply(*p, weight, x_fp8, out, stream);
  if (out != y) {
    check_cuda(cudaMemcpyAsync(y, out, static_cast<size_t>(rows * n) * sizeof(float),
                               cudaMemcpyDeviceToDevice, stream),
               "copying an FP8 product's rows");
  }
  return true;
}

}  // namespace deepinfer::cuda

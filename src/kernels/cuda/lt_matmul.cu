// Products on the tensor cores through cuBLASLt, for prompts: x rounded to the weights'
// 16-bit type, plans cached per shape.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

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
  // Keyed by (bf16, rows, n, k); prompt chunks bring many row counts, so the cache is bounded.
  std::map<std::tuple<bool, int64_t, int64_t, int64_t>, std::unique_ptr<LtPlan>> plans;
  static constexpr size_t kMaxPlans = 4096;

  const LtPlan& plan(bool bf16, int64_t rows, int64_t n, int64_t k);
};

// Column-major view: D (n x rows) = W^T-as-stored (k x n, transposed) * x^T (k x rows).
const LtPlan& LtMatmul::Impl::plan(bool bf16, int64_t rows, int64_t n, int64_t k) {
  std::unique_ptr<LtPlan>& slot = plans[{bf16, rows, n, k}];
  if (slot) return *slot;
  auto made = std::make_unique<LtPlan>();
  check_lt(cublasLtMatmulDescCreate(&made->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  cublasOperation_t transpose = CUBLAS_OP_T;
  check_lt(cublasLtMatmulDescSetAttribute(made->op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                          sizeof(transpose)),
           "transa");
  auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
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
  check_lt(status, "heuristic");
  if (found == 0)
    fail("cuBLASLt: no algorithm for a {} {}x{}x{} product", bf16 ? "bf16" : "f16", rows, n, k);
  made->algo = heuristic.algo;
  if (plans.size() > kMaxPlans) {
    plans.clear();
    return *(plans[{bf16, rows, n, k}] = std::move(made));
  }
  slot = std::move(made);
  return *slot;
}

LtMatmul::LtMatmul() : impl_(std::make_unique<Impl>()) {
  check_lt(cublasLtCreate(&impl_->handle), "create");
}

LtMatmul::~LtMatmul() {
  impl_->plans.clear();
  if (impl_->handle) cublasLtDestroy(impl_->handle);
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
  const LtPlan& p = impl_->plan(bf16, rows, n, k);
  const float one = 1.0f, zero = 0.0f;
  check_lt(cublasLtMatmul(impl_->handle, p.op, &one, weight, p.a, x_rounded, p.b, &zero, y, p.d, y,
                          p.d, &p.algo, impl_->workspace.data(), impl_->workspace.bytes(), stream),
           "matmul");
}

}  // namespace deepinfer::cuda

// cuBLASLt GEMM with cached plans.
//
// Layout choice: cuBLASLt is column-major, and a row-major [R, C] matrix read as column-major is
// its transpose [C, R]. So instead of asking for row-major layouts (CUBLASLT_ORDER_ROW, whose
// epilogue support is narrower) we compute C^T = op(B)^T op(A)^T in column-major: cuBLASLt's "A"
// is our B, its "B" is our A, and its m, n are our N, M. The result C^T in column-major is exactly
// row-major C, and cuBLASLt's bias (one value per row of its D) is one value per column of our C.
#include "core/cuda/cublaslt_gemm.h"

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "core/cuda/cuda_check.h"

namespace ft {
namespace {

// Largest power of two (capped at 16, what cuBLASLt asks about) dividing the address.
uint32_t alignment_bytes(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  for (uint32_t bytes = 16; bytes > 4; bytes /= 2) {
    if (address % bytes == 0) return bytes;
  }
  return 4;
}

struct PlanKey {
  int64_t m, n, k;
  bool transpose_a, transpose_b, accumulate, has_bias;
  Activation activation;
  bool fuse;  // whether to try the fused epilogue at all
  uint32_t align_a, align_b, align_c;

  auto tie() const {
    return std::tie(m, n, k, transpose_a, transpose_b, accumulate, has_bias, activation, fuse,
                    align_a, align_b, align_c);
  }
  bool operator<(const PlanKey& other) const { return tie() < other.tie(); }
};

cublasLtEpilogue_t fused_epilogue(Activation activation, bool has_bias) {
  switch (activation) {
    case Activation::kNone:
      return has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    case Activation::kRelu:
      return has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    case Activation::kGelu:
      return has_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// One cached cuBLASLt setup. Owns its descriptors; destruction ignores errors (never throws).
struct Plan {
  cublasLtMatmulDesc_t matmul = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr;  // cuBLASLt's A = our B
  cublasLtMatrixLayout_t layout_b = nullptr;  // cuBLASLt's B = our A
  cublasLtMatrixLayout_t layout_c = nullptr;  // C and D share it (in-place accumulate)
  cublasLtMatmulAlgo_t algo{};
  bool epilogue_fused = false;  // false: any bias/activation runs afterwards as a separate kernel

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() { release(); }

  void release() {
    if (layout_c != nullptr) cublasLtMatrixLayoutDestroy(layout_c);
    if (layout_b != nullptr) cublasLtMatrixLayoutDestroy(layout_b);
    if (layout_a != nullptr) cublasLtMatrixLayoutDestroy(layout_a);
    if (matmul != nullptr) cublasLtMatmulDescDestroy(matmul);
    layout_a = layout_b = layout_c = nullptr;
    matmul = nullptr;
  }
};

// Fills `plan` for `key` with the given epilogue. Returns false when cuBLASLt has no algorithm.
bool try_build_plan(Plan& plan, cublasLtHandle_t handle, const PlanKey& key,
                    cublasLtEpilogue_t epilogue, const float* bias, size_t workspace_bytes) {
  plan.release();
  FT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.matmul, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = key.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  FT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.matmul, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                 sizeof(op_a)));
  FT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.matmul, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                 sizeof(op_b)));
  FT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.matmul, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                 &epilogue, sizeof(epilogue)));
  if (epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_RELU_BIAS ||
      epilogue == CUBLASLT_EPILOGUE_GELU_BIAS) {
    FT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.matmul, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias, sizeof(bias)));
  }

  // Stored shapes (before op) in cuBLASLt's column-major terms; see the comment at the file top.
  const auto N = static_cast<uint64_t>(key.n), M = static_cast<uint64_t>(key.m),
             K = static_cast<uint64_t>(key.k);
  if (key.transpose_b) {
    FT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.layout_a, CUDA_R_32F, K, N, key.k));
  } else {
    FT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.layout_a, CUDA_R_32F, N, K, key.n));
  }
  if (key.transpose_a) {
    FT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.layout_b, CUDA_R_32F, M, K, key.m));
  } else {
    FT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.layout_b, CUDA_R_32F, K, M, key.k));
  }
  FT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.layout_c, CUDA_R_32F, N, M, key.n));

  cublasLtMatmulPreference_t preference = nullptr;
  FT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  // The algorithm must not assume more alignment than the pointers it will see.
  const uint32_t align_lt_a = key.align_b, align_lt_b = key.align_a;
  const cublasStatus_t set_status = [&] {
    cublasStatus_t status =
        cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace_bytes, sizeof(workspace_bytes));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(
          preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_lt_a, sizeof(uint32_t));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(
          preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_lt_b, sizeof(uint32_t));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(
          preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_c, sizeof(uint32_t));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(
          preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_c, sizeof(uint32_t));
    return status;
  }();
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  cublasStatus_t status = set_status;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulAlgoGetHeuristic(handle, plan.matmul, plan.layout_a, plan.layout_b,
                                            plan.layout_c, plan.layout_c, preference, 1, &result,
                                            &returned);
  }
  cublasLtMatmulPreferenceDestroy(preference);
  FT_CUBLAS_CHECK(set_status);
  // NOT_SUPPORTED means "no algorithm for this combination", which the caller can work around.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && returned == 0))
    return false;
  FT_CUBLAS_CHECK(status);
  plan.algo = result.algo;
  plan.epilogue_fused = epilogue != CUBLASLT_EPILOGUE_DEFAULT;
  return true;
}

}  // namespace

struct CublasLtGemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;

  ~Impl() {
    plans.clear();
    if (workspace != nullptr) cudaFree(workspace);
    if (handle != nullptr) cublasLtDestroy(handle);
  }
};

CublasLtGemm::CublasLtGemm(size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  FT_CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
  if (workspace_bytes > 0) FT_CUDA_CHECK(cudaMalloc(&impl_->workspace, workspace_bytes));
  impl_->workspace_bytes = workspace_bytes;
}

CublasLtGemm::~CublasLtGemm() = default;

size_t CublasLtGemm::cached_plan_count() const {
  return impl_->plans.size();
}

void CublasLtGemm::matmul(float* c, const float* a, const float* b, const float* bias, int64_t m,
                          int64_t n, int64_t k, const GemmOptions& options, cudaStream_t stream) {
  FT_CHECK(m > 0 && n > 0 && k > 0, "CublasLtGemm::matmul: shapes must be positive, got M = ", m,
           ", N = ", n, ", K = ", k);
  FT_CHECK(c != nullptr && a != nullptr && b != nullptr,
           "CublasLtGemm::matmul: null operand (c = ", c, ", a = ", a, ", b = ", b, ")");
  const bool has_bias = bias != nullptr;
  // cuBLASLt reads the bias vector with 16-byte loads; an unaligned bias runs unfused instead.
  const bool fuse = fused_epilogue_enabled_ && (!has_bias || alignment_bytes(bias) == 16);
  const PlanKey key{m,
                    n,
                    k,
                    options.transpose_a,
                    options.transpose_b,
                    options.accumulate,
                    has_bias,
                    options.activation,
                    fuse,
                    alignment_bytes(a),
                    alignment_bytes(b),
                    alignment_bytes(c)};

  auto found = impl_->plans.find(key);
  if (found == impl_->plans.end()) {
    auto plan = std::make_unique<Plan>();
    const cublasLtEpilogue_t wanted =
        fuse ? fused_epilogue(options.activation, has_bias) : CUBLASLT_EPILOGUE_DEFAULT;
    bool built = try_build_plan(*plan, impl_->handle, key, wanted, bias, impl_->workspace_bytes);
    if (!built && wanted != CUBLASLT_EPILOGUE_DEFAULT) {
      built = try_build_plan(*plan, impl_->handle, key, CUBLASLT_EPILOGUE_DEFAULT, nullptr,
                             impl_->workspace_bytes);
    }
    FT_CHECK(built, "CublasLtGemm: cuBLASLt has no FP32 algorithm for M = ", m, ", N = ", n,
             ", K = ", k, ", transpose_a = ", options.transpose_a,
             ", transpose_b = ", options.transpose_b);
    found = impl_->plans.emplace(key, std::move(plan)).first;
  }
  Plan& plan = *found->second;
  const bool needs_epilogue = has_bias || options.activation != Activation::kNone;
  if (plan.epilogue_fused && has_bias) {
    // The plan is shared by every call of this shape; the bias pointer is per call.
    FT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.matmul, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias, sizeof(bias)));
  }
  const float alpha = 1.0f;
  const float beta = options.accumulate ? 1.0f : 0.0f;
  FT_CUBLAS_CHECK(cublasLtMatmul(impl_->handle, plan.matmul, &alpha, b, plan.layout_a, a,
                                 plan.layout_b, &beta, c, plan.layout_c, c, plan.layout_c,
                                 &plan.algo, impl_->workspace, impl_->workspace_bytes, stream));
  if (needs_epilogue && !plan.epilogue_fused) {
    bias_activation_forward_cuda(c, bias, m, n, options.activation, stream);
    ++unfused_epilogue_calls_;
  }
}

}  // namespace ft

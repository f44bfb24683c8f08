// cuBLASLt GEMM with cached plans.
//
// Layout choice: cuBLASLt is column-major, and a row-major [R, C] matrix read as column-major is
// its transpose [C, R]. So instead of asking for row-major layouts (CUBLASLT_ORDER_ROW, whose
// epilogue support is narrower) we compute C^T = op(B)^T op(A)^T in column-major: cuBLASLt's "A"
// is our B, its "B" is our A, and its m, n are our N, M. The result C^T in column-major is exactly
// row-major C, and cuBLASLt's bias (one value per row of its D) is one value per column of our C.
// The same reading maps the gradient epilogues: DGELU_BGRAD sums over the columns of its D, i.e.
// over the rows of our C (bias_grad[N]); BGRADB reduces its B = our A over k (bias_grad[M]).
#include "core/cuda/cublaslt_gemm.h"

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "core/cuda/bf16_kernels.h"
#include "core/cuda/bias_activation_kernel.h"
#include "core/cuda/cuda_check.h"
#include "core/determinism.h"
#include "core/launch_counter.h"

namespace ft {
namespace {

// Largest power of two (capped at 16, what cuBLASLt asks about, and at least the element size)
// dividing the address and, for a batch, the byte offset between matrices (every matrix of the
// batch must be that aligned). bf16 views (a head's columns) may be only 2-byte aligned.
uint32_t alignment_bytes(const void* pointer, uint32_t element_bytes = sizeof(float),
                         int64_t batch = 1, int64_t batch_stride = 0) {
  const auto address = reinterpret_cast<uintptr_t>(pointer) |
                       (batch > 1 ? static_cast<uintptr_t>(batch_stride) * element_bytes : 0);
  for (uint32_t bytes = 16; bytes > element_bytes; bytes /= 2) {
    if (address % bytes == 0) return bytes;
  }
  return element_bytes;
}

cudaDataType_t cuda_data_type(DType dtype) {
  return dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// Statuses cuBLASLt returns from its checks, before it launches anything.
bool refused_before_launch(cublasStatus_t status) {
  return status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE;
}

// The oneDNN cache's key (core/gemm.h) plus what only cuBLASLt's plan depends on.
struct PlanKey {
  GemmShapeKey shape;
  int64_t ld_aux;
  bool fuse;           // whether to try the fused epilogue at all
  bool tf32;           // fp32 operands only: bf16 ones always compute in CUBLAS_COMPUTE_32F
  bool deterministic;  // core/determinism.h: no split-K reduction offered
  uint32_t align_a, align_b, align_c;

  auto tie() const {
    return std::tuple_cat(shape.tie(),
                          std::tie(ld_aux, fuse, tf32, deterministic, align_a, align_b, align_c));
  }
  bool operator<(const PlanKey& other) const { return tie() < other.tie(); }
};

cublasLtEpilogue_t fused_epilogue(Epilogue epilogue, bool has_bias) {
  switch (epilogue) {
    case Epilogue::kNone:
      return has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::kRelu:
      return has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    case Epilogue::kGeluTanh:
      return has_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    case Epilogue::kGeluTanhAux:
      return has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::kDGeluTanh:
      return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::kDGeluTanhBiasGrad:
      return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case Epilogue::kBiasGradA:
      return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool epilogue_uses_aux(Epilogue epilogue) {
  return epilogue == Epilogue::kGeluTanhAux || epilogue == Epilogue::kDGeluTanh ||
         epilogue == Epilogue::kDGeluTanhBiasGrad;
}

// One cached cuBLASLt setup. Owns its descriptors; destruction ignores errors (never throws).
struct Plan {
  cublasLtMatmulDesc_t matmul = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr;  // cuBLASLt's A = our B
  cublasLtMatrixLayout_t layout_b = nullptr;  // cuBLASLt's B = our A
  cublasLtMatrixLayout_t layout_c = nullptr;  // C and D share it (in-place accumulate)
  cublasLtMatmulAlgo_t algo{};
  bool epilogue_fused = false;  // false: any epilogue runs afterwards as a separate kernel

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

void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
              const void* value, size_t bytes) {
  FT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, value, bytes));
}

// The epilogue's per-call pointers: the bias (or bias gradient) vector and the aux matrix.
void set_epilogue_pointers(cublasLtMatmulDesc_t desc, const GemmArgs& args) {
  const void* bias_pointer = args.bias_grad != nullptr ? static_cast<const void*>(args.bias_grad)
                                                       : static_cast<const void*>(args.bias);
  if (bias_pointer != nullptr)
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_pointer, sizeof(bias_pointer));
  if (args.aux != nullptr) {
    const void* aux_pointer = args.aux;
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux_pointer, sizeof(aux_pointer));
  }
}

// `ld` and `batch_stride` are in elements of `type`.
cublasLtMatrixLayout_t make_layout(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld,
                                   int64_t batch, int64_t batch_stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  FT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, rows, cols, ld));
  if (batch > 1) {
    const auto count = static_cast<int32_t>(batch);
    FT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                     &count, sizeof(count)));
    FT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride, sizeof(batch_stride)));
  }
  return layout;
}

// Fills `plan` for `key` with the given epilogue; `args` supplies the epilogue pointers whose
// alignment the heuristic looks at. Returns false when cuBLASLt has no algorithm.
bool try_build_plan(Plan& plan, cublasLtHandle_t handle, const PlanKey& key,
                    cublasLtEpilogue_t epilogue, const GemmArgs& args, size_t workspace_bytes) {
  plan.release();
  const GemmShapeKey& shape = key.shape;
  const cublasComputeType_t compute = key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // Scale type fp32 (alpha, beta) for both operand types: the bf16 x bf16 -> fp32 combination
  // cuBLASLt lists with CUBLAS_COMPUTE_32F.
  FT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.matmul, compute, CUDA_R_32F));
  const cublasOperation_t op_a = shape.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = shape.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(plan.matmul, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a));
  set_desc(plan.matmul, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b));
  set_desc(plan.matmul, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    set_epilogue_pointers(plan.matmul, args);
    if (args.aux != nullptr)
      set_desc(plan.matmul, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &key.ld_aux, sizeof(key.ld_aux));
  }

  // Stored shapes (before op) in cuBLASLt's column-major terms; see the comment at the file top.
  const auto N = static_cast<uint64_t>(shape.n), M = static_cast<uint64_t>(shape.m),
             K = static_cast<uint64_t>(shape.k);
  const cudaDataType_t operand_type = cuda_data_type(shape.operands);
  plan.layout_a =
      shape.transpose_b
          ? make_layout(operand_type, K, N, shape.ldb, shape.batch, shape.batch_stride_b)
          : make_layout(operand_type, N, K, shape.ldb, shape.batch, shape.batch_stride_b);
  plan.layout_b =
      shape.transpose_a
          ? make_layout(operand_type, M, K, shape.lda, shape.batch, shape.batch_stride_a)
          : make_layout(operand_type, K, M, shape.lda, shape.batch, shape.batch_stride_a);
  plan.layout_c = make_layout(CUDA_R_32F, N, M, shape.ldc, shape.batch, shape.batch_stride_c);

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
    // Pinned: every dot product in one sequence, so a run's bits depend on the algorithm alone.
    const uint32_t no_split_k = CUBLASLT_REDUCTION_SCHEME_NONE;
    if (status == CUBLAS_STATUS_SUCCESS && key.deterministic)
      status = cublasLtMatmulPreferenceSetAttribute(
          preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_split_k, sizeof(no_split_k));
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
  // NOT_SUPPORTED means "no algorithm for this combination", which the caller can work around;
  // so is any refusal of a fused epilogue (some report INVALID_VALUE), since the plain GEMM and
  // the unfused kernel remain. A returned result whose own state is not SUCCESS is no algorithm
  // either: its algo field is not usable.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && returned == 0) ||
      (status != CUBLAS_STATUS_SUCCESS && epilogue != CUBLASLT_EPILOGUE_DEFAULT))
    return false;
  FT_CUBLAS_CHECK(status);
  if (result.state != CUBLAS_STATUS_SUCCESS) return false;
  plan.algo = result.algo;
  plan.epilogue_fused = epilogue != CUBLASLT_EPILOGUE_DEFAULT;
  return true;
}

// The unfused twin of the epilogue, after a plain GEMM has written (or added into) C. Only
// kBiasGradA reads an operand (A, fp32 or bf16); the others work on the fp32 C and aux.
void run_unfused_epilogue(float* c, GemmOperand a, const GemmArgs& r, cudaStream_t stream) {
  switch (r.epilogue) {
    case Epilogue::kNone:
    case Epilogue::kRelu:
    case Epilogue::kGeluTanh:
    case Epilogue::kGeluTanhAux:
      epilogue_forward_cuda(c, r.aux, r.bias, r.epilogue, r.batch, r.m, r.n, r.ldc,
                            r.batch_stride_c, r.ld_aux, stream);
      return;
    case Epilogue::kDGeluTanh:
      dgelu_in_place_cuda(c, r.aux, r.m, r.n, r.ldc, r.ld_aux, stream);
      return;
    case Epilogue::kDGeluTanhBiasGrad:
      column_sums_cuda(r.bias_grad, false, c, c, r.aux, r.m, r.n, r.ldc, r.ldc, r.ld_aux, stream);
      return;
    case Epilogue::kBiasGradA: {
      // bias_grad[m] = sum_k op(A)[m, k]: column sums of a stored [K, M], row sums of [M, K].
      if (a.dtype == DType::kBF16) {
        const auto* a_bf16 = static_cast<const bf16_bits*>(a.data);
        if (r.transpose_a)
          bf16_column_sums_cuda(r.bias_grad, a_bf16, r.k, r.m, r.lda, stream);
        else
          bf16_row_sums_cuda(r.bias_grad, a_bf16, r.m, r.k, r.lda, stream);
        return;
      }
      const auto* a_fp32 = static_cast<const float*>(a.data);
      if (r.transpose_a)
        column_sums_cuda(r.bias_grad, false, nullptr, a_fp32, nullptr, r.k, r.m, 0, r.lda, 0,
                         stream);
      else
        row_sums_cuda(r.bias_grad, a_fp32, r.m, r.k, r.lda, stream);
      return;
    }
  }
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

void CublasLtGemm::run(float* c, GemmOperand a, GemmOperand b, const GemmArgs& args,
                       cudaStream_t stream) {
  check_gemm_args(args, "gemm_cuda");
  FT_CHECK(c != nullptr && a.data != nullptr && b.data != nullptr,
           "gemm_cuda: null operand (c = ", c, ", a = ", a.data, ", b = ", b.data, ")");
  FT_CHECK(a.dtype == b.dtype, "gemm_cuda: a ", dtype_name(a.dtype), " A with a ",
           dtype_name(b.dtype), " B");
  const DType operands = a.dtype;
  const auto operand_bytes = static_cast<uint32_t>(dtype_size(operands));
  const GemmArgs r = resolve_gemm_strides(args);
  const bool has_bias = r.bias != nullptr;
  // cuBLASLt reads the bias (and bias gradient) vector with 16-byte loads and needs the aux
  // matrix 16-byte aligned with ld_aux % 8 == 0; anything else runs unfused instead.
  const bool uses_aux = epilogue_uses_aux(r.epilogue);
  const bool fuse = fused_epilogue_enabled_ && (!has_bias || alignment_bytes(r.bias) == 16) &&
                    (r.bias_grad == nullptr || alignment_bytes(r.bias_grad) == 16) &&
                    (!uses_aux || (alignment_bytes(r.aux) == 16 && r.ld_aux % 8 == 0));
  const PlanKey key{GemmShapeKey::of(r, operands),
                    uses_aux ? r.ld_aux : 0,
                    fuse,
                    gemm_tf32() && operands == DType::kF32,
                    deterministic_algorithms(),
                    alignment_bytes(a.data, operand_bytes, r.batch, r.batch_stride_a),
                    alignment_bytes(b.data, operand_bytes, r.batch, r.batch_stride_b),
                    alignment_bytes(c, sizeof(float), r.batch, r.batch_stride_c)};

  auto found = impl_->plans.find(key);
  if (found == impl_->plans.end()) {
    auto plan = std::make_unique<Plan>();
    const cublasLtEpilogue_t wanted =
        fuse ? fused_epilogue(r.epilogue, has_bias) : CUBLASLT_EPILOGUE_DEFAULT;
    bool built = try_build_plan(*plan, impl_->handle, key, wanted, r, impl_->workspace_bytes);
    if (!built && wanted != CUBLASLT_EPILOGUE_DEFAULT) {
      built = try_build_plan(*plan, impl_->handle, key, CUBLASLT_EPILOGUE_DEFAULT, r,
                             impl_->workspace_bytes);
    }
    FT_CHECK(built, "CublasLtGemm: cuBLASLt has no algorithm for ", dtype_name(operands),
             " operands into fp32 with M = ", r.m, ", N = ", r.n, ", K = ", r.k,
             ", batch = ", r.batch, ", transpose_a = ", r.transpose_a,
             ", transpose_b = ", r.transpose_b, ", lda = ", r.lda, ", ldb = ", r.ldb,
             ", ldc = ", r.ldc);
    found = impl_->plans.emplace(key, std::move(plan)).first;
  }
  Plan& plan = *found->second;
  const bool needs_epilogue = has_bias || r.epilogue != Epilogue::kNone;
  // The plan is shared by every call of this key; the epilogue's pointers are per call.
  if (plan.epilogue_fused) set_epilogue_pointers(plan.matmul, r);
  const float alpha = r.alpha;
  const float beta = r.accumulate ? 1.0f : 0.0f;
  auto matmul = [&](Plan& with) {
    return cublasLtMatmul(impl_->handle, with.matmul, &alpha, b.data, with.layout_a, a.data,
                          with.layout_b, &beta, c, with.layout_c, c, with.layout_c, &with.algo,
                          impl_->workspace, impl_->workspace_bytes, stream);
  };
  cublasStatus_t status = matmul(plan);
  // The heuristic may offer an algorithm for a fused epilogue that the matmul itself then
  // refuses: the key falls back to the plain GEMM plus our epilogue kernel for good, as when the
  // heuristic refuses up front. Only a refusal is retried (argument and support checks run
  // before any launch, so C is untouched); after an execution or internal error part of the
  // GEMM may have run, and running it again would add its products into C twice when it
  // accumulates, so that error is thrown.
  if (refused_before_launch(status) && plan.epilogue_fused) {
    auto plain = std::make_unique<Plan>();
    FT_CHECK(try_build_plan(*plain, impl_->handle, key, CUBLASLT_EPILOGUE_DEFAULT, r,
                            impl_->workspace_bytes),
             "CublasLtGemm: the fused epilogue failed (status ", static_cast<int>(status),
             ") and cuBLASLt has no plain algorithm for ", dtype_name(operands),
             " operands with M = ", r.m, ", N = ", r.n, ", K = ", r.k);
    found->second = std::move(plain);
    status = matmul(*found->second);
  }
  Plan& used = *found->second;
  FT_CUBLAS_CHECK(status);
  count_launch(LaunchKind::kGemm);
  if (needs_epilogue && !used.epilogue_fused) {
    run_unfused_epilogue(c, a, r, stream);
    ++unfused_epilogue_calls_;
  }
}

}  // namespace ft

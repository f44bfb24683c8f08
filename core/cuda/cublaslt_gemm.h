// CublasLtGemm: the CUDA engine behind gemm_cuda() (core/gemm.h): row-major GEMM on device
// buffers through cuBLASLt, fp32 or bf16 operands (GemmOperand) into an fp32 C, in core/gemm.h's
// vocabulary (GemmArgs, Epilogue): transposes,
// leading dimensions, strided batches, alpha, accumulate (beta = 1), a bias and the training
// epilogues (GELU with the pre-activation kept, dGELU, bias gradients) fused into cuBLASLt's
// epilogue where it offers an algorithm, and otherwise run as a plain GEMM followed by the
// unfused twin of core/cuda/bias_activation_kernel.h (counted in unfused_epilogue_calls()).
// Descriptors, layouts and the chosen algorithm are cached per shape/strides/epilogue/alignment/
// operand dtype/TF32 key, so a training step after the first does no cuBLASLt planning. Compute
// is CUBLAS_COMPUTE_32F (true FP32, matching a CPU FP32 GEMM to rounding) unless
// set_gemm_tf32(true) selects CUBLAS_COMPUTE_32F_FAST_TF32 for fp32 operands. bf16 operands are
// CUDA_R_16BF layouts with CUBLAS_COMPUTE_32F (their products are exact in fp32, as on the CPU);
// C, the bias, aux and the bias gradient stay fp32, which is also cuBLASLt's default type for
// the bias and aux of an fp32 D.
// Thread safety: not thread-safe (plan cache, one workspace). Calls on one instance must be on one
// stream or otherwise ordered, because they share the workspace.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/gemm.h"

namespace ft {

class CublasLtGemm {
 public:
  // 32 MiB is the workspace cuBLAS recommends for Hopper; smaller limits the algorithms offered.
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

  // Creates the cuBLASLt handle and allocates the workspace on the current device.
  explicit CublasLtGemm(size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // c = the GEMM of `args` (core/gemm.h) on device pointers (aligned to their element size at
  // least), enqueued on `stream`. Throws ft::Error when check_gemm_args rejects `args` or the
  // operands' dtypes differ.
  // REQUIRES: c aliases neither a nor b.
  void run(float* c, GemmOperand a, GemmOperand b, const GemmArgs& args, cudaStream_t stream);

  // When false, every call runs a plain GEMM followed by the unfused epilogue kernel; tests use it
  // to compare the fused epilogue against its unfused twin. Default true.
  void set_fused_epilogue_enabled(bool enabled) { fused_epilogue_enabled_ = enabled; }

  // Counters for tests and logs: cached plans, and calls that ran the epilogue unfused.
  size_t cached_plan_count() const;
  int64_t unfused_epilogue_calls() const { return unfused_epilogue_calls_; }

 private:
  struct Impl;  // keeps cublasLt.h out of every includer
  std::unique_ptr<Impl> impl_;
  bool fused_epilogue_enabled_ = true;
  int64_t unfused_epilogue_calls_ = 0;
};

}  // namespace ft

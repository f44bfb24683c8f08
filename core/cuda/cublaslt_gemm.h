// CublasLtGemm: row-major float32 GEMM on CUDA device buffers through cuBLASLt, with the bias
// and activation fused into cuBLASLt's epilogue where it offers an algorithm:
//   C[M,N] = act(op(A)[M,K] * op(B)[K,N] (+ C if accumulate) (+ bias[N] broadcast over rows)).
// Descriptors, layouts and the chosen algorithm are cached per shape/options/alignment key, so a
// training step after the first does no cuBLASLt planning. Compute is CUBLAS_COMPUTE_32F: true
// FP32, never TF32, so results match a CPU FP32 GEMM to rounding.
// Thread safety: not thread-safe (plan cache, one workspace). Calls on one instance must be on one
// stream or otherwise ordered, because they share the workspace.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/cuda/bias_activation_kernel.h"

namespace ft {

struct GemmOptions {
  bool transpose_a = false;  // A is stored row-major as [K, M] and used transposed
  bool transpose_b = false;  // B is stored row-major as [N, K] and used transposed
  bool accumulate = false;   // add into the existing C (beta = 1) instead of overwriting it
  Activation activation = Activation::kNone;  // applied last, after accumulation and bias
};

class CublasLtGemm {
 public:
  // 32 MiB is the workspace cuBLAS recommends for Hopper; smaller limits the algorithms offered.
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

  // Creates the cuBLASLt handle and allocates the workspace on the current device.
  explicit CublasLtGemm(size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // REQUIRES: c, a, b are device pointers holding M*N, M*K, K*N floats (at least 4-byte aligned);
  //           bias is null or a device pointer to N floats; m, n, k > 0; c aliases neither a nor b.
  void matmul(float* c, const float* a, const float* b, const float* bias, int64_t m, int64_t n,
              int64_t k, const GemmOptions& options, cudaStream_t stream);

  // When false, every call runs a plain GEMM followed by bias_activation_forward_cuda; tests use it
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

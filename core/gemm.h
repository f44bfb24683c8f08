// CPU GEMM through oneDNN matmul, with primitives cached by shape so a training step creates none.
//   C[b] (=|+=) alpha * op(A[b]) · op(B[b]) (+ bias) (epilogue)   for b in [0, batch)
// All matrices are row-major with explicit leading dimensions, so views (heads inside a [B,T,3C]
// activation, weight row blocks) need no copies.
// Thread safety: call from one thread (the training thread); oneDNN parallelises inside.
#pragma once
#include <cstdint>

namespace ft {

// Elementwise map applied to C inside the GEMM (a oneDNN eltwise post-op, after the bias).
// kGeluTanh is the inference form of fusion/ops/linear_gelu.h: it cannot hand back the
// pre-activation that training's backward needs.
enum class Epilogue { kNone, kRelu, kGeluTanh };

struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
  bool transpose_a = false;           // A stored [K, M] instead of [M, K]
  bool transpose_b = false;           // B stored [N, K] instead of [K, N] (nn.Linear weights)
  int64_t lda = 0, ldb = 0, ldc = 0;  // row strides in floats; 0 = packed
  int64_t batch_stride_a = 0, batch_stride_b = 0, batch_stride_c = 0;  // 0 = packed
  float alpha = 1.0f;           // REQUIRES: 1 when bias is set
  bool accumulate = false;      // C += result. REQUIRES: epilogue kNone
  const float* bias = nullptr;  // [N], broadcast over rows
  Epilogue epilogue = Epilogue::kNone;
};

void gemm(float* c, const float* a, const float* b, const GemmArgs& args);

// Wall time spent inside gemm() while timing is on, so benchmarks can report a step's GEMM share.
// Off by default (two clock reads per call); not synchronised: the training thread only.
void set_gemm_timing(bool on);
double gemm_timed_ms();

// Number of distinct primitives created so far (tests check the cache works).
int64_t gemm_primitive_count();

}  // namespace ft

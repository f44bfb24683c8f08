// The unfused twins of cuBLASLt's epilogues (core/gemm.h's Epilogue), run after a plain GEMM when
// cuBLASLt offers no fused algorithm (a bias that is not 16-byte aligned, an odd ld_aux, an
// epilogue it lacks for FP32), and the small reductions the GEMM-based ops need (bias gradients).
// All matrices are row-major device matrices with explicit row strides (floats).
// Thread safety: the launchers only enqueue work on the given stream; safe from any thread.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/gemm.h"

namespace ft {

// In place over `batch` matrices c[rows, cols] (row stride ldc, batch stride batch_stride_c):
//   pre = c + bias (bias null: pre = c);  kGeluTanhAux: aux = pre;  c = act(pre)
// with act the identity (kNone), relu (kRelu) or gelu_tanh (kGeluTanh, kGeluTanhAux).
// REQUIRES: epilogue is a forward epilogue; aux non-null (row stride ld_aux, batch 1) exactly for
//           kGeluTanhAux; bias null or [cols].
void epilogue_forward_cuda(float* c, float* aux, const float* bias, Epilogue epilogue,
                           int64_t batch, int64_t rows, int64_t cols, int64_t ldc,
                           int64_t batch_stride_c, int64_t ld_aux, cudaStream_t stream);

// x[r, c] *= gelu'(pre[r, c]): cuBLASLt's DGELU epilogue.
void dgelu_in_place_cuda(float* x, const float* pre, int64_t rows, int64_t cols, int64_t ld_x,
                         int64_t ld_pre, cudaStream_t stream);

// Column reduction with an optional dGELU, one pass over x [rows, cols]:
//   value[r, c] = x[r, c] * (pre ? gelu'(pre[r, c]) : 1)
//   values_out[r, c] = value[r, c]                   (when values_out is non-null; may alias x)
//   sums[c] (+= with accumulate, else =) sum_r value[r, c]   (when sums is non-null)
// Deterministic: every column is summed by one block in a fixed order.
void column_sums_cuda(float* sums, bool accumulate, float* values_out, const float* x,
                      const float* pre, int64_t rows, int64_t cols, int64_t ld_out, int64_t ld_x,
                      int64_t ld_pre, cudaStream_t stream);

// sums[r] = sum_c x[r, c] over x [rows, cols].
void row_sums_cuda(float* sums, const float* x, int64_t rows, int64_t cols, int64_t ld_x,
                   cudaStream_t stream);

}  // namespace ft

// Conversions between float32 and bfloat16 arrays on the CPU, with the rounding of
// core/math/bf16_math.h (nearest, ties to even). These are the cast kernels of mixed precision:
// the eager cast op, the weight-copy sweep and the GEMM operands of the fallback path all use
// them, so every bf16 path rounds the same way.
// Thread safety: pure functions; large calls split over the OpenMP pool.
#pragma once
#include <cstdint>

#include "core/math/bf16_math.h"

namespace ft {

void cast_to_bf16(bf16_bits* out, const float* in, int64_t count);
void cast_to_float(float* out, const bf16_bits* in, int64_t count);
// One row (or any short run) in the calling thread, for kernels that round their output as they
// write it: no thread team of its own.
inline void store_row_bf16(bf16_bits* out, const float* in, int64_t count) {
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) out[i] = float_to_bf16(in[i]);
}

// A [rows, cols] block with row strides (elements); 0 means packed.
void cast_rows_to_bf16(bf16_bits* out, int64_t out_stride, const float* in, int64_t in_stride,
                       int64_t rows, int64_t cols);

}  // namespace ft

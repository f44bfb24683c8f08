// The warp-per-row LayerNorm of kernels/layernorm_math.h writing its row in bf16, for the CUDA
// kernels of the ops that normalise straight into a GEMM operand (LayerNormCastOp,
// ResidualLayerNormOp with a bf16 `normed`): layernorm_warp_row_forward_with's statistics and
// per-element math, each output rounded once with core/math/bf16_math.h, as the CPU
// forms round their fp32 row buffer (store_row_bf16).
// Thread safety: device functions over the pointers given.
#pragma once
#include <cstdint>

#include "core/math/bf16_math.h"
#include "kernels/layernorm_math.h"

namespace ft {

#if defined(__CUDACC__)
// layernorm_warp_row_forward with y in bf16; every lane returns with the row's mean and rstd.
__device__ inline void layernorm_warp_row_forward_bf16(bf16_bits* y, float* mean_out,
                                                       float* rstd_out, const float* x,
                                                       const float* weight, const float* bias,
                                                       int64_t n, float eps, int lane) {
  layernorm_warp_row_forward_with([y](int64_t i, float value) { y[i] = float_to_bf16(value); },
                                  mean_out, rstd_out, x, weight, bias, n, eps, lane);
}

// The fp32 and bf16 forms under one name, for kernels templated on their output type.
__device__ inline void layernorm_warp_row_forward_as(float* y, float* mean_out, float* rstd_out,
                                                     const float* x, const float* weight,
                                                     const float* bias, int64_t n, float eps,
                                                     int lane) {
  layernorm_warp_row_forward(y, mean_out, rstd_out, x, weight, bias, n, eps, lane);
}
__device__ inline void layernorm_warp_row_forward_as(bf16_bits* y, float* mean_out, float* rstd_out,
                                                     const float* x, const float* weight,
                                                     const float* bias, int64_t n, float eps,
                                                     int lane) {
  layernorm_warp_row_forward_bf16(y, mean_out, rstd_out, x, weight, bias, n, eps, lane);
}
#endif  // defined(__CUDACC__)

}  // namespace ft

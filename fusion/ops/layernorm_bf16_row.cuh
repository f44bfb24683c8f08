// The warp-per-row LayerNorm of model/ops/layernorm_math.h writing its row in bf16, for the CUDA
// kernels of the ops that normalise straight into a GEMM operand (LayerNormCastOp,
// ResidualLayerNormOp with a bf16 `normed`): the same FT_HD statistics and per-element math as
// layernorm_warp_row_forward, each output rounded once with core/math/bf16_math.h, as the CPU
// forms round their fp32 row buffer (store_row_bf16).
// Thread safety: device functions over the pointers given.
#pragma once
#include <cstdint>

#include "core/math/bf16_math.h"
#include "model/ops/layernorm_math.h"

namespace ft {

#if defined(__CUDACC__)
// layernorm_warp_row_forward with y in bf16; every lane returns with the row's mean and rstd.
__device__ inline void layernorm_warp_row_forward_bf16(bf16_bits* y, float* mean_out,
                                                       float* rstd_out, const float* x,
                                                       const float* weight, const float* bias,
                                                       int64_t n, float eps, int lane) {
  float sum = 0.0f;
  for (int64_t i = lane; i < n; i += kLayerNormWarp) sum += x[i];
  const float mean = layernorm_mean(layernorm_warp_sum(sum), n);
  float square_sum = 0.0f;
  for (int64_t i = lane; i < n; i += kLayerNormWarp)
    square_sum += layernorm_squared_deviation(x[i], mean);
  const float rstd = layernorm_rstd(layernorm_warp_sum(square_sum), n, eps);
  for (int64_t i = lane; i < n; i += kLayerNormWarp)
    y[i] = float_to_bf16(layernorm_output(x[i], mean, rstd, weight[i], bias[i]));
  *mean_out = mean;
  *rstd_out = rstd;
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

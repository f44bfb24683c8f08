// Per-row LayerNorm math shared by LayerNormOp (rows of width C, or one head's q/k columns of
// width head_dim), fusion/'s BatchedLayerNormOp (many such LayerNorms in one launch) and
// ResidualLayerNormOp, on the CPU and on CUDA:
//   y = (x - mean) * rstd * weight + bias,   rstd = 1 / sqrt(var + eps),  var biased (over n).
// The FT_HD helpers hold the arithmetic of one element and of a row's statistics; the CPU row
// loops below and the warp-per-row CUDA kernels (layernorm.cu, residual_layernorm.cu) only differ
// in how they sum a row (CPU: `omp simd` vector partial sums; CUDA: lane partial sums then a warp
// shuffle tree), so CPU tests of these helpers cover the GPU's math.
// The input gradient and the parameter gradients are separate functions so callers can run the
// former in parallel over rows and the latter (a reduction over rows) serially without races.
// Thread safety: pure functions over the pointers given.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace ft {

constexpr float kLayerNormEps = 1e-5f;

// mean = sum / n (also the backward's row means mean(g) and mean(g * xhat)).
FT_HD float layernorm_mean(float sum, int64_t n) {
  return sum / static_cast<float>(n);
}

// One term of the second pass: squared deviations from the mean, which avoid the cancellation of
// E[x^2] - E[x]^2.
FT_HD float layernorm_squared_deviation(float x, float mean) {
  const float centered = x - mean;
  return centered * centered;
}

// rstd = 1 / sqrt(sum (x - mean)^2 / n + eps). IEEE sqrt and division on both devices (nvcc
// keeps -prec-sqrt and -prec-div on without --use_fast_math).
FT_HD float layernorm_rstd(float square_sum, int64_t n, float eps) {
  return 1.0f / std::sqrt(square_sum / static_cast<float>(n) + eps);
}

FT_HD float layernorm_xhat(float x, float mean, float rstd) {
  return (x - mean) * rstd;
}

FT_HD float layernorm_output(float x, float mean, float rstd, float weight, float bias) {
  return (x - mean) * rstd * weight + bias;
}

// a * xhat, rounded as a * (x - mean) * rstd: the summand of mean(g * xhat) (a = g = dy * weight)
// and of dweight (a = dy).
FT_HD float layernorm_times_xhat(float a, float x, float mean, float rstd) {
  return a * (x - mean) * rstd;
}

// With xhat = (x - mean) rstd and g = dy * weight (the gradient reaching xhat):
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
// The two mean terms are the gradient flowing through mean and rstd, which depend on every x.
FT_HD float layernorm_input_grad(float dy, float weight, float x, float mean, float rstd,
                                 float g_mean, float g_xhat_mean) {
  const float xhat = (x - mean) * rstd;
  return rstd * (dy * weight - g_mean - xhat * g_xhat_mean);
}

#if !defined( \
    __CUDACC__)  // the `omp simd` row loops are host code (nvcc's host pass lacks -fopenmp)

// One row of n values; writes y[0, n) and the row's statistics, in two passes over x (mean, then
// squared deviations).
inline void layernorm_row_forward(float* y, float* mean_out, float* rstd_out, const float* x,
                                  const float* weight, const float* bias, int64_t n, float eps) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const float mean = layernorm_mean(sum, n);
  float square_sum = 0.0f;
#pragma omp simd reduction(+ : square_sum)
  for (int64_t i = 0; i < n; ++i) square_sum += layernorm_squared_deviation(x[i], mean);
  const float rstd = layernorm_rstd(square_sum, n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] = layernorm_output(x[i], mean, rstd, weight[i], bias[i]);
  *mean_out = mean;
  *rstd_out = rstd;
}

// The two row means mean(g) and mean(g * xhat) of the input gradient (layernorm_input_grad), for
// callers (fused ops) that apply the gradient in their own loop.
inline void layernorm_row_backward_means(float* g_mean, float* g_xhat_mean, const float* dy,
                                         const float* x, const float* weight, float mean,
                                         float rstd, int64_t n) {
  float g_sum = 0.0f, g_xhat_sum = 0.0f;
#pragma omp simd reduction(+ : g_sum, g_xhat_sum)
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i] * weight[i];
    g_sum += g;
    g_xhat_sum += layernorm_times_xhat(g, x[i], mean, rstd);
  }
  *g_mean = layernorm_mean(g_sum, n);
  *g_xhat_mean = layernorm_mean(g_xhat_sum, n);
}

inline void layernorm_row_backward_input(float* dx, const float* dy, const float* x,
                                         const float* weight, float mean, float rstd, int64_t n) {
  float g_mean, g_xhat_mean;
  layernorm_row_backward_means(&g_mean, &g_xhat_mean, dy, x, weight, mean, rstd, n);
  for (int64_t i = 0; i < n; ++i)
    dx[i] += layernorm_input_grad(dy[i], weight[i], x[i], mean, rstd, g_mean, g_xhat_mean);
}

// y = xhat * weight + bias  =>  dweight += dy * xhat, dbias += dy.
inline void layernorm_row_backward_params(float* dweight, float* dbias, const float* dy,
                                          const float* x, float mean, float rstd, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dweight[i] += layernorm_times_xhat(dy[i], x[i], mean, rstd);
    dbias[i] += dy[i];
  }
}

#endif  // !defined(__CUDACC__)

#if defined(__CUDACC__)
// Warp-per-row forms for the CUDA kernels: lane l handles columns l, l + 32, ..., so a kernel that
// has just written a row in that pattern (ResidualLayerNormOp's sum) reads back only its own
// lane's writes.
constexpr int kLayerNormWarp = 32;

// The xor butterfly leaves the same sum, bit for bit, in every lane (float + is commutative).
__device__ inline float layernorm_warp_sum(float value) {
  for (int offset = kLayerNormWarp / 2; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// layernorm_row_forward for one warp, each output handed to store(i, value) (a plain write here,
// a bf16 rounding in fusion/ops/layernorm_bf16_row.cuh); every lane returns with the row's mean
// and rstd.
template <typename Store>
__device__ inline void layernorm_warp_row_forward_with(Store store, float* mean_out,
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
    store(i, layernorm_output(x[i], mean, rstd, weight[i], bias[i]));
  *mean_out = mean;
  *rstd_out = rstd;
}

// layernorm_row_forward for one warp; every lane returns with the row's mean and rstd.
__device__ inline void layernorm_warp_row_forward(float* y, float* mean_out, float* rstd_out,
                                                  const float* x, const float* weight,
                                                  const float* bias, int64_t n, float eps,
                                                  int lane) {
  layernorm_warp_row_forward_with([y](int64_t i, float value) { y[i] = value; }, mean_out, rstd_out,
                                  x, weight, bias, n, eps, lane);
}

// layernorm_row_backward_means for one warp; every lane gets both means.
__device__ inline void layernorm_warp_row_backward_means(float* g_mean, float* g_xhat_mean,
                                                         const float* dy, const float* x,
                                                         const float* weight, float mean,
                                                         float rstd, int64_t n, int lane) {
  float g_sum = 0.0f, g_xhat_sum = 0.0f;
  for (int64_t i = lane; i < n; i += kLayerNormWarp) {
    const float g = dy[i] * weight[i];
    g_sum += g;
    g_xhat_sum += layernorm_times_xhat(g, x[i], mean, rstd);
  }
  *g_mean = layernorm_mean(layernorm_warp_sum(g_sum), n);
  *g_xhat_mean = layernorm_mean(layernorm_warp_sum(g_xhat_sum), n);
}
#endif  // defined(__CUDACC__)

}  // namespace ft

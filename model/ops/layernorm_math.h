// Per-row LayerNorm math shared by LayerNormOp (rows of width C, or one head's q/k columns of
// width head_dim) and fusion/'s BatchedLayerNormOp (many such LayerNorms in one launch):
//   y = (x - mean) * rstd * weight + bias,   rstd = 1 / sqrt(var + eps),  var biased (over n).
// Row sums use `omp simd` reductions (vector partial sums, a fixed order per build).
// The input gradient and the parameter gradients are separate functions so callers can run the
// former in parallel over rows and the latter (a reduction over rows) serially without races.
// Thread safety: pure functions over the pointers given.
#pragma once
#include <cmath>
#include <cstdint>

namespace ft {

constexpr float kLayerNormEps = 1e-5f;

// One row of n values; writes y[0, n) and the row's statistics. Two passes over x (mean, then
// squared deviations) avoid the cancellation of E[x^2] - E[x]^2.
inline void layernorm_row_forward(float* y, float* mean_out, float* rstd_out, const float* x,
                                  const float* weight, const float* bias, int64_t n, float eps) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const float mean = sum / static_cast<float>(n);
  float square_sum = 0.0f;
#pragma omp simd reduction(+ : square_sum)
  for (int64_t i = 0; i < n; ++i) {
    const float centered = x[i] - mean;
    square_sum += centered * centered;
  }
  const float rstd = 1.0f / std::sqrt(square_sum / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mean) * rstd * weight[i] + bias[i];
  *mean_out = mean;
  *rstd_out = rstd;
}

// With xhat = (x - mean) rstd and g = dy * weight (the gradient reaching xhat):
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
// The two mean terms are the gradient flowing through mean and rstd, which depend on every x.
// The two row means mean(g) and mean(g * xhat) of the input gradient, for callers (fused ops)
// that apply the gradient in their own loop.
inline void layernorm_row_backward_means(float* g_mean, float* g_xhat_mean, const float* dy,
                                         const float* x, const float* weight, float mean,
                                         float rstd, int64_t n) {
  float g_sum = 0.0f, g_xhat_sum = 0.0f;
#pragma omp simd reduction(+ : g_sum, g_xhat_sum)
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i] * weight[i];
    g_sum += g;
    g_xhat_sum += g * (x[i] - mean) * rstd;
  }
  *g_mean = g_sum / static_cast<float>(n);
  *g_xhat_mean = g_xhat_sum / static_cast<float>(n);
}

inline void layernorm_row_backward_input(float* dx, const float* dy, const float* x,
                                         const float* weight, float mean, float rstd, int64_t n) {
  float g_mean, g_xhat_mean;
  layernorm_row_backward_means(&g_mean, &g_xhat_mean, dy, x, weight, mean, rstd, n);
  for (int64_t i = 0; i < n; ++i) {
    const float xhat = (x[i] - mean) * rstd;
    dx[i] += rstd * (dy[i] * weight[i] - g_mean - xhat * g_xhat_mean);
  }
}

// y = xhat * weight + bias  =>  dweight += dy * xhat, dbias += dy.
inline void layernorm_row_backward_params(float* dweight, float* dbias, const float* dy,
                                          const float* x, float mean, float rstd, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dweight[i] += dy[i] * (x[i] - mean) * rstd;
    dbias[i] += dy[i];
  }
}

}  // namespace ft

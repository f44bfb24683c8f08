// GELU, tanh approximation, through the host/device helpers of core/math/gelu_math.h.
#include "kernels/gelu.h"

#include "core/math/gelu_math.h"

namespace ft {

void gelu_forward(float* y, const float* x, int64_t numel) {
#pragma omp parallel for if (numel > 262144)
  for (int64_t i = 0; i < numel; ++i) y[i] = gelu_tanh(x[i]);
}

// Chain rule through an elementwise map: dx = dy * gelu'(x); gelu' is derived in
// core/math/gelu_math.h.
void gelu_backward(float* dx, const float* dy, const float* x, int64_t numel) {
#pragma omp parallel for if (numel > 262144)
  for (int64_t i = 0; i < numel; ++i) dx[i] += dy[i] * gelu_tanh_grad(x[i]);
}

}  // namespace ft

// The per-element optimizer math, shared by the CPU range kernels (model/optimizer.cpp) and the
// CUDA kernels (kernels/optimizer.cu, fusion/multi_tensor.cu), so the CPU tests cover the GPU's
// math. Under nvcc the helpers are __host__ __device__ (core/hd.h); the device-only block
// reduction of the gradient norm at the end is shared by both CUDA files.
// Thread safety: pure functions.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace ft {

// Per-step AdamW constants, computed once by the optimizer for every range it updates.
struct AdamWStep {
  float beta1 = 0, beta2 = 0, eps = 0;
  float step_size = 0;       // lr / (1 - beta1^t)
  float inv_sqrt_bias2 = 0;  // 1 / sqrt(1 - beta2^t)
  float decay = 0;           // lr * weight_decay, for ranges with Param::weight_decay
};

struct SgdStep {
  float lr = 0, momentum = 0, weight_decay = 0;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer starts as the first gradient
};

// AdamW (Loshchilov & Hutter): m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2,
// p -= lr (m_hat / (sqrt(v_hat) + eps) + wd p), with m_hat = m / (1-b1^t), v_hat = v / (1-b2^t).
// The decay is decoupled: it is not folded into g, so it does not pass through the moments.
// `decay` is step.decay for parameters with weight decay, 0 otherwise.
FT_HD void adamw_element(float& value, float& exp_avg, float& exp_avg_sq, float grad,
                         const AdamWStep& step, float decay) {
  const float m = step.beta1 * exp_avg + (1.0f - step.beta1) * grad;
  const float v = step.beta2 * exp_avg_sq + (1.0f - step.beta2) * grad * grad;
  exp_avg = m;
  exp_avg_sq = v;
  const float denom = std::sqrt(v) * step.inv_sqrt_bias2 + step.eps;
  value -= step.step_size * m / denom + decay * value;
}

// SGD with momentum, PyTorch semantics: g' = g + wd p; buf = mu buf + g' (buf = g' on the first
// step, whatever the buffer held); p -= lr (nesterov ? g' + mu buf : buf).
// `decay` is step.weight_decay for parameters with weight decay, 0 otherwise.
FT_HD void sgd_element(float& value, float& momentum_buffer, float grad, const SgdStep& step,
                       float decay) {
  const float g = grad + decay * value;
  const float buf = step.first_step ? g : step.momentum * momentum_buffer + g;
  momentum_buffer = buf;
  value -= step.lr * (step.nesterov ? g + step.momentum * buf : buf);
}

}  // namespace ft

#if defined(__CUDACC__)
namespace ft {

// Threads of a gradient-norm block; both CUDA sweeps use it, so their partials agree bitwise.
constexpr int kSquareSumThreads = 512;

// The sum over the block of each thread's `thread_value`, valid in thread 0: a fixed
// shared-memory tree, so the result depends only on the values (deterministic).
// REQUIRES: blockDim.x == kSquareSumThreads; every thread of the block calls it, once per kernel.
__device__ inline double block_sum(double thread_value) {
  __shared__ double thread_sums[kSquareSumThreads];
  thread_sums[threadIdx.x] = thread_value;
  __syncthreads();
  for (int half = kSquareSumThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half)
      thread_sums[threadIdx.x] += thread_sums[threadIdx.x + half];
    __syncthreads();
  }
  return thread_sums[0];
}

// The sum of data[i]^2 for i < count in double, valid in thread 0: thread t sums i = t, t + 512,
// ... in index order, then block_sum adds the threads. Same REQUIRES as block_sum.
__device__ inline double block_square_sum(const float* data, int64_t count) {
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += kSquareSumThreads) {
    const double x = data[i];
    sum += x * x;
  }
  return block_sum(sum);
}

}  // namespace ft
#endif

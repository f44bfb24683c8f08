// GELU's kernels, tanh approximation (GPT-2), elementwise over `numel` floats, CPU (gelu.cpp)
// beside CUDA (gelu.cu), shared by GeluOp (model/ops/gelu.h) and fusion/'s GeluCastOp, whose
// backward is GELU's:
//   y = 0.5 x (1 + tanh(s (x + 0.044715 x^3))),  s = sqrt(2/pi)    (core/math/gelu_math.h)
// Both call the same helpers; they use a vectorisable exp (libm's scalar tanhf cost 4-30 ns per
// call and made GELU the most expensive op of a small GPT step).
// Thread safety: pure functions over the pointers given.
#pragma once
#include <cstdint>

#include "core/device.h"

namespace ft {

void gelu_forward(float* y, const float* x, int64_t numel);
// dx += dy * gelu'(x).
void gelu_backward(float* dx, const float* dy, const float* x, int64_t numel);
// The same on device pointers, enqueued on `stream` (gelu.cu; CUDA builds only).
void gelu_forward_cuda(float* y, const float* x, int64_t numel, CudaStream stream);
void gelu_backward_cuda(float* dx, const float* dy, const float* x, int64_t numel,
                        CudaStream stream);

}  // namespace ft

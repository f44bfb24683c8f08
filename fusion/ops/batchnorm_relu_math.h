// The ReLU's per-element math in BatchNorm's fused variants, shared by their CPU loops
// (batchnorm_relu_kernels.cpp, batchnorm_add_relu.cpp) and CUDA kernels
// (batchnorm_relu_kernels.cu), on top of BatchNorm's own helpers (kernels/batchnorm_math.h).
// Each is the expression ReluOp evaluates on BatchNorm's output, so a fused op agrees with its
// unfused chain bit for bit.
// Thread safety: pure functions.
#pragma once
#include "core/hd.h"
#include "kernels/batchnorm_math.h"

namespace ft {

// dy where the ReLU passed its input (y > 0), else 0; y > 0 exactly where z > 0. T is float or a
// GCC vector of floats (whose ?: selects per lane).
template <typename T>
FT_HD T batchnorm_relu_masked(T dy, T y, T zero) {
  return y > zero ? dy : zero;
}

// z = scale * x + shift, then max(z, 0) (0 for NaN, as ReluOp).
template <typename T>
FT_HD T batchnorm_scale_shift_relu(T scale, T x, T shift, T zero) {
  const T z = batchnorm_scale_shift(scale, x, shift);
  return z > zero ? z : zero;
}

}  // namespace ft

// GELU, tanh approximation (GPT-2): y = 0.5 x (1 + tanh(u)), u = s (x + 0.044715 x^3), s =
// sqrt(2/pi). Since 0.5 (1 + tanh(u)) = sigmoid(2u), we compute y = x sigmoid(2u) with a
// vectorisable exp. Shared by the CPU loops and the CUDA kernels, so CPU tests cover the GPU's
// math.
#pragma once
#include "core/hd.h"
#include "core/math/fast_exp.h"

namespace ft {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

// -2u as (-2 s) (c x x * x + x): the factor -2 is exact, so folding it into s rounds as -2 (s t).
FT_HD float gelu_sigmoid_term(float x) {  // sigmoid(2u)
  const float minus_two_u = (-2.0f * kGeluScale) * fused_multiply_add(kGeluCubic * x * x, x, x);
  return 1.0f / (1.0f + fast_exp(minus_two_u));
}

FT_HD float gelu_tanh(float x) {
  return x * gelu_sigmoid_term(x);
}

// With g = sigmoid(2u): dy/dx = g + x g (1 - g) 2 du/dx, du/dx = s (1 + 3 c x^2).
// (The same as 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx with t = tanh(u) = 2g - 1.)
// From g = gelu_sigmoid_term(x) already at hand (Linear+GELU's forward keeps gelu'(pre) with y).
FT_HD float gelu_tanh_grad_from_sigmoid(float x, float g) {
  const float dinner = kGeluScale * fused_multiply_add(3.0f * kGeluCubic * x, x, 1.0f);
  return fused_multiply_add(2.0f * x * g * (1.0f - g), dinner, g);
}

FT_HD float gelu_tanh_grad(float x) {
  return gelu_tanh_grad_from_sigmoid(x, gelu_sigmoid_term(x));
}

}  // namespace ft

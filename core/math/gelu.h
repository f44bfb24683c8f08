// GELU, tanh approximation (GPT-2): y = 0.5 x (1 + tanh(s (x + 0.044715 x^3))), s = sqrt(2/pi).
// Shared by the CPU loops and the CUDA kernels, so CPU tests cover the GPU's math.
#pragma once
#include <cmath>

#include "core/hd.h"

namespace ft {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

FT_HD float gelu_tanh(float x) {
  const float inner = kGeluScale * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}

// dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 c x^2), with t = tanh(s (x + c x^3)).
FT_HD float gelu_tanh_grad(float x) {
  const float inner = kGeluScale * (x + kGeluCubic * x * x * x);
  const float t = tanhf(inner);
  const float dinner = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner;
}

}  // namespace ft

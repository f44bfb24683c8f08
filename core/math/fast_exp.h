// exp(x) for float that compilers vectorise (no libm call), shared by CPU loops and CUDA kernels.
// Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, then a degree-6 Taylor/minimax
// polynomial for e^r and a 2^n exponent splice. Max relative error about 2e-7 (a few ulp) on
// [-87, 88]; inputs outside clamp to the float range ends. GELU and softmax use it: libm's expf is
// scalar unless -ffast-math, which we do not build with.
#pragma once
#include <cstdint>

#include "core/hd.h"

namespace ft {

FT_HD float fast_exp(float x) {
  // Two plain selects become vector min/max; fminf or a nested ternary would block vectorising.
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  // Round to nearest by adding and removing 1.5 * 2^23 (exact for |t| < 2^22); floorf would not
  // vectorise without -fno-trapping-math.
  constexpr float kRoundMagic = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRoundMagic) - kRoundMagic;
  // ln2 split in a high part exact in float and a low correction, so r keeps full precision.
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t exponent_bits = (static_cast<int32_t>(n) + 127) << 23;
#if defined(__CUDA_ARCH__)
  const float scale = __int_as_float(exponent_bits);
#else
  const float scale = __builtin_bit_cast(float, exponent_bits);  // memcpy would block vectorising
#endif
  return p * scale;
}

}  // namespace ft

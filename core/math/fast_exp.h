// exp(x) for float that compilers vectorise (no libm call), shared by CPU loops and CUDA kernels.
// Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, then a degree-6 Taylor/minimax
// polynomial for e^r and a 2^n exponent splice. Max relative error about 2e-7 (a few ulp) on
// [-87, 88]; inputs outside clamp to the float range ends. GELU and softmax use it: libm's expf is
// scalar unless -ffast-math, which we do not build with. Its multiply-adds are fused explicitly
// (fused_multiply_add): one rounding each on every path, and a third fewer vector operations; a
// build for a target without FMA (FT_MARCH below x86-64-v3) would call libm's fmaf instead.
#pragma once
#include <cstdint>

#include "core/hd.h"

namespace ft {

// a * b + c rounded once, on every path: the vector loops (GCC turns the builtin into vfmadd where
// the target has FMA, and vectorises it), the AVX-512 row loops (which write _mm512_fmadd_ps) and
// CUDA. Explicit, so files compiled without contraction (-ffp-contract=off, for bit-for-bit twins)
// round the same as the others, and one operation where a mul and an add would be two.
FT_HD float fused_multiply_add(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return fmaf(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}

FT_HD float fast_exp(float x) {
  // Two plain selects become vector min/max; fminf or a nested ternary would block vectorising.
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  // Round to nearest by adding and removing 1.5 * 2^23 (exact for |t| < 2^22); floorf would not
  // vectorise without -fno-trapping-math.
  constexpr float kRoundMagic = 12582912.0f;
  const float n = fused_multiply_add(x, 1.44269504088896341f, kRoundMagic) - kRoundMagic;
  // ln2 split in a high part exact in float and a low correction, so r keeps full precision.
  float r = fused_multiply_add(-n, 0.693359375f, x);
  r = fused_multiply_add(n, 2.12194440e-4f, r);
  float p = 1.0f / 720.0f;
  p = fused_multiply_add(p, r, 1.0f / 120.0f);
  p = fused_multiply_add(p, r, 1.0f / 24.0f);
  p = fused_multiply_add(p, r, 1.0f / 6.0f);
  p = fused_multiply_add(p, r, 0.5f);
  p = fused_multiply_add(p, r, 1.0f);
  p = fused_multiply_add(p, r, 1.0f);
  const int32_t exponent_bits = (static_cast<int32_t>(n) + 127) << 23;
#if defined(__CUDA_ARCH__)
  const float scale = __int_as_float(exponent_bits);
#else
  const float scale = __builtin_bit_cast(float, exponent_bits);  // memcpy would block vectorising
#endif
  return p * scale;
}

}  // namespace ft

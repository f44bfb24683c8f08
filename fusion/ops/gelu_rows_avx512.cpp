// The AVX-512 row loops of gelu_rows_avx512.h, compiled with AVX512-BF16 enabled for this file
// alone (CMakeLists.txt); gelu_rows.cpp decides at run time whether they run. No library template
// is instantiated here: a weak copy compiled with AVX-512 could be picked by the linker for the
// rest of an AVX2 build.
#if defined(__AVX512BF16__)
#include "fusion/ops/gelu_rows_avx512.h"

#include <immintrin.h>

#include <cstring>

#include "core/math/fast_exp.h"
#include "core/math/gelu_math.h"

namespace ft {
namespace {

// fast_exp (core/math/fast_exp.h), step for step, its fused multiply-adds as vfmadd.
inline __m512 exp_lanes(__m512 x) {
  const __m512 low = _mm512_set1_ps(-87.0f), high = _mm512_set1_ps(88.0f);
  x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, low, _CMP_LT_OQ), x, low);
  x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, high, _CMP_GT_OQ), x, high);
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 n =
      _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic), magic);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  const float terms[] = {1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
  for (float term : terms) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(term));
  // The zero-masked forms with every lane set: GCC 12 warns that the plain ones read an
  // uninitialised register.
  const __mmask16 all = 0xFFFF;
  const __m512i exponent = _mm512_maskz_slli_epi32(
      all, _mm512_add_epi32(_mm512_maskz_cvttps_epi32(all, n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(exponent));
}

// gelu_sigmoid_term: 1 / (1 + exp((-2 s) (c x x * x + x))).
inline __m512 sigmoid_term(__m512 x) {
  const __m512 cubic_factor = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(kGeluCubic), x), x);
  const __m512 minus_two_u =
      _mm512_mul_ps(_mm512_set1_ps(-2.0f * kGeluScale), _mm512_fmadd_ps(cubic_factor, x, x));
  const __m512 e = exp_lanes(minus_two_u);
  return _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

// gelu_tanh_grad_from_sigmoid: (2 x g (1 - g)) (s (3 c x * x + 1)) + g.
inline __m512 gelu_grad_from_sigmoid(__m512 x, __m512 g) {
  const __m512 square_factor = _mm512_mul_ps(_mm512_set1_ps(3.0f * kGeluCubic), x);
  const __m512 dinner = _mm512_mul_ps(_mm512_set1_ps(kGeluScale),
                                      _mm512_fmadd_ps(square_factor, x, _mm512_set1_ps(1.0f)));
  const __m512 weight = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(2.0f), x), g),
                                      _mm512_sub_ps(_mm512_set1_ps(1.0f), g));
  return _mm512_fmadd_ps(weight, dinner, g);
}

inline void store_bf16(bf16_bits* out, __m512 values, __mmask16 lanes) {
  const __m256bh rounded = _mm512_cvtneps_pbh(values);
  __m256i bits;
  std::memcpy(&bits, &rounded, sizeof(bits));
  _mm256_mask_storeu_epi16(out, lanes, bits);
}

inline __mmask16 lanes_left(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// y and gelu' of one vector of pre, sharing the sigmoid term.
inline void gelu_and_grad_lanes(bf16_bits* out, float* grad, const float* pre, __mmask16 lanes) {
  const __m512 x = _mm512_maskz_loadu_ps(lanes, pre);
  const __m512 g = sigmoid_term(x);
  store_bf16(out, _mm512_mul_ps(x, g), lanes);
  _mm512_mask_storeu_ps(grad, lanes, gelu_grad_from_sigmoid(x, g));
}

// dpre = dy gelu' (+ db) for one vector.
inline void scale_lanes(bf16_bits* dpre, float* dbias, const float* dy, const float* grad,
                        __mmask16 lanes) {
  const __m512 gradient =
      _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, dy), _mm512_maskz_loadu_ps(lanes, grad));
  if (dbias != nullptr)
    _mm512_mask_storeu_ps(dbias, lanes,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, dbias), gradient));
  store_bf16(dpre, gradient, lanes);
}

}  // namespace

// Four vectors a step: each is one long chain of dependent operations (the exp's polynomial, the
// division), and four independent ones let the core overlap them.
constexpr int64_t kStep = 64;

void gelu_and_grad_row_bf16_avx512(bf16_bits* out, float* grad, const float* pre, int64_t count) {
  int64_t i = 0;
  for (; i + kStep <= count; i += kStep)
    for (int v = 0; v < 4; ++v)
      gelu_and_grad_lanes(out + i + 16 * v, grad + i + 16 * v, pre + i + 16 * v, 0xFFFF);
  for (; i < count; i += 16) gelu_and_grad_lanes(out + i, grad + i, pre + i, lanes_left(count - i));
}

void gelu_backward_row_bf16_avx512(bf16_bits* dpre, float* dbias, const float* dy,
                                   const float* grad, int64_t begin, int64_t end) {
  int64_t i = begin;
  for (; i + kStep <= end; i += kStep)
    for (int v = 0; v < 4; ++v)
      scale_lanes(dpre + i + 16 * v, dbias == nullptr ? nullptr : dbias + i + 16 * v,
                  dy + i + 16 * v, grad + i + 16 * v, 0xFFFF);
  for (; i < end; i += 16)
    scale_lanes(dpre + i, dbias == nullptr ? nullptr : dbias + i, dy + i, grad + i,
                lanes_left(end - i));
}

}  // namespace ft
#endif  // __AVX512BF16__

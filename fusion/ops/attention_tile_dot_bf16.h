// The pieces of FlashAttentionOp's AVX512-BF16 tiles (flash_attention_bf16_tiles.cpp): packing
// bf16 rows into vdpbf16ps operand layouts, the register-blocked dot-product GEMM, and the
// softmax's vector exp and lane reductions. Include only from a file
// compiled with AVX512-BF16 enabled, and only from one: these inline functions, compiled with other
// flags elsewhere, would be one symbol to the linker. Thread safety: pure functions on caller-owned
// buffers.
#pragma once
#if !defined(__AVX512BF16__)
#error "attention_tile_dot_bf16.h needs AVX512-BF16 enabled (-mavx512bf16)"
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/math/bf16_math.h"

namespace ft::attention_bf16::tile {

constexpr int64_t kLanes = 16;  // floats (or bf16 pairs) per vector
// Rows of C per register block, two vectors each: 8 accumulators, each B vector loaded feeding 4
// products (8 rows measured slower at gpt_small: its causal blocks compute more masked pairs).
constexpr int kRowBlock = 4;

using word = uint32_t;

inline int64_t lesser(int64_t a, int64_t b) {
  return a < b ? a : b;
}
inline int64_t greater(int64_t a, int64_t b) {
  return a < b ? b : a;
}
inline int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

// Rows ahead that the packing loops prefetch: a head's rows lie a whole row of the [B*T, C]
// activation apart, each a new line from L3 or memory, and the loops do too little per row to
// hide that wait.
constexpr int64_t kPrefetchRows = 8;

// out[t][0, width) = rows[t][0, hd) zero padded, for t < count.
inline void pack_rows(bf16_bits* out, const bf16_bits* rows, int64_t stride, int64_t count,
                      int64_t hd, int64_t width) {
  for (int64_t t = 0; t < count; ++t) {
    // A loop, not memcpy: a library call per 64-byte row cost more than the copy.
#pragma omp simd
    for (int64_t d = 0; d < hd; ++d) out[t * width + d] = rows[t * stride + d];
    for (int64_t d = hd; d < width; ++d) out[t * width + d] = 0;
  }
}

// out[p][d] = (rows[2p][d], rows[2p+1][d]) for the pairs covering `count` rows; rows past count
// and columns past hd are 0.
inline void pack_row_pairs(word* out, const bf16_bits* rows, int64_t stride, int64_t count,
                           int64_t hd, int64_t width) {
  for (int64_t p = 0; 2 * p < count; ++p) {
    const bf16_bits* even = rows + 2 * p * stride;
    word* pair = out + p * width;
    if (2 * p + 1 < count) {
      const bf16_bits* odd = even + stride;
#pragma omp simd
      for (int64_t d = 0; d < hd; ++d) pair[d] = even[d] | static_cast<word>(odd[d]) << 16;
    } else {
#pragma omp simd
      for (int64_t d = 0; d < hd; ++d) pair[d] = even[d];
    }
    for (int64_t d = hd; d < width; ++d) pair[d] = 0;
  }
}

// The 16 x 16 word transpose of the words of rows[0, 16): out[p * ld + s] = the word of
// (rows[s][2p], rows[s][2p+1]). Rows from `count` on read as zeros.
inline void transpose_16x16(word* out, int64_t ld, const bf16_bits* rows, int64_t stride,
                            int64_t count) {
  // Masked forms throughout, as GCC 12's plain shuffles warn of an uninitialised value.
  constexpr __mmask16 kAll = 0xFFFF;
  constexpr __mmask8 kAll64 = 0xFF;
  __m512i a[16], b[16];
  for (int s = 0; s < 16; ++s)
    a[s] = s < count ? _mm512_loadu_si512(rows + s * stride) : _mm512_setzero_si512();
  // Interleave words, then word pairs, then 128-bit lanes twice: each stage halves the distance.
  for (int s = 0; s < 16; s += 2) {
    b[s] = _mm512_maskz_unpacklo_epi32(kAll, a[s], a[s + 1]);
    b[s + 1] = _mm512_maskz_unpackhi_epi32(kAll, a[s], a[s + 1]);
  }
  for (int s = 0; s < 16; s += 4)
    for (int i = 0; i < 2; ++i) {
      a[s + i] = _mm512_maskz_unpacklo_epi64(kAll64, b[s + i], b[s + 2 + i]);
      a[s + 2 + i] = _mm512_maskz_unpackhi_epi64(kAll64, b[s + i], b[s + 2 + i]);
    }
  for (int s = 0; s < 16; s += 8)
    for (int i = 0; i < 4; ++i) {
      b[s + i] = _mm512_maskz_shuffle_i32x4(kAll, a[s + i], a[s + 4 + i], 0x88);
      b[s + 4 + i] = _mm512_maskz_shuffle_i32x4(kAll, a[s + i], a[s + 4 + i], 0xDD);
    }
  for (int i = 0; i < 8; ++i) {
    a[i] = _mm512_maskz_shuffle_i32x4(kAll, b[i], b[8 + i], 0x88);
    a[8 + i] = _mm512_maskz_shuffle_i32x4(kAll, b[i], b[8 + i], 0xDD);
  }
  // a[j] now holds word column p's rows 0..15 in order, p = j with its two low bits swapped (the
  // second stage's order).
  for (int j = 0; j < 16; ++j)
    _mm512_storeu_si512(out + ((j & ~3) | (j & 1) << 1 | (j & 2) >> 1) * ld, a[j]);
}

// out[p][s] = (rows[s][2p], rows[s][2p+1]) for s < count, 0 for count <= s < ld and for the
// elements past hd. REQUIRES: ld >= round_up(count, kLanes) (whole blocks of rows are stored).
inline void pack_transposed(word* out, int64_t ld, const bf16_bits* rows, int64_t stride,
                            int64_t count, int64_t hd, int64_t width) {
  const int64_t whole_words = hd / 2;
  int64_t s = 0;
  // Head dims of whole vectors (gpt_small's 32): 16 rows at a time through registers, as the
  // scalar word stores below were ~12% of forward_head.
  if (hd % (2 * kLanes) == 0) {
    for (; s < count; s += kLanes)
      for (int64_t p = 0; p < whole_words; p += kLanes)
        transpose_16x16(out + p * ld + s, ld, rows + s * stride + 2 * p, stride, count - s);
  }
  // Contiguous loads, one row at a time; the stores spread over width / 2 lines that stay in L1.
  for (; s < count; ++s) {
    const bf16_bits* row = rows + s * stride;
    __builtin_prefetch(row + kPrefetchRows * stride);
    for (int64_t p = 0; p < whole_words; ++p) {
      word pair;
      std::memcpy(&pair, row + 2 * p, sizeof(pair));
      out[p * ld + s] = pair;
    }
    if (hd % 2) out[whole_words * ld + s] = row[hd - 1];
  }
  // The whole-vector path wrote zeros up to round_up(count, kLanes) already.
  for (int64_t p = 0; p < width / 2; ++p)
    for (int64_t z = p < (hd + 1) / 2 ? s : 0; z < ld; ++z) out[p * ld + z] = 0;
}

inline __m512bh as_bf16(__m512i bits) {
  return reinterpret_cast<__m512bh&>(bits);
}

// A vector of C stored as the output's element type: fp32 as is, or rounded to bf16 (nearest
// even, as vcvtneps2bf16 rounds; the flash output written for a bf16 GEMM).
inline void store_lanes(float* at, __m512 values) {
  _mm512_storeu_ps(at, values);
}
inline void store_lanes(bf16_bits* at, __m512 values) {
  const __m256bh rounded = _mm512_cvtneps_pbh(values);
  std::memcpy(at, &rounded, sizeof(rounded));
}

// C[r][0, kVectors * kLanes) (+)= sum over word steps p in [p_begin, p_end) of the pair products
// A(r, p) . B[p][.], A(r, p) at a[r * lda + p] (rows) or a[p * lda + r] (kColumns); kScaled
// stores row r times row_scale[r] (a compile-time choice, so that the other forms' code stays
// as it was). C is fp32, or bf16 for a written (not accumulated) result.
template <int kRows, int kVectors, bool kColumns, bool kScaled = false, typename Out>
inline __attribute__((always_inline)) void dot_block(Out* c, int64_t ldc, const word* a,
                                                     int64_t lda, const word* b, int64_t ldb,
                                                     int64_t p_begin, int64_t p_end,
                                                     bool accumulate, const float* row_scale) {
  __m512 acc[kRows][kVectors];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < kVectors; ++v) {
      if constexpr (sizeof(Out) == sizeof(float))
        acc[r][v] = accumulate ? _mm512_loadu_ps(c + r * ldc + v * kLanes) : _mm512_setzero_ps();
      else
        acc[r][v] = _mm512_setzero_ps();  // a bf16 C is written, never added into
    }
  for (int64_t p = p_begin; p < p_end; ++p) {
    __m512bh b_row[kVectors];
    for (int v = 0; v < kVectors; ++v)
      b_row[v] = as_bf16(_mm512_loadu_si512(b + p * ldb + v * kLanes));
    for (int r = 0; r < kRows; ++r) {
      const word a_rp = kColumns ? a[p * lda + r] : a[r * lda + p];
      const __m512bh a_pair = as_bf16(_mm512_set1_epi32(static_cast<int>(a_rp)));
      for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a_pair, b_row[v]);
    }
  }
  if constexpr (kScaled)
    for (int r = 0; r < kRows; ++r)
      for (int v = 0; v < kVectors; ++v)
        acc[r][v] = _mm512_mul_ps(acc[r][v], _mm512_set1_ps(row_scale[r]));
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < kVectors; ++v) store_lanes(c + r * ldc + v * kLanes, acc[r][v]);
}

template <int kRows, bool kColumns, bool kScaled, typename Out>
inline void dot_rows(Out* c, int64_t ldc, const word* a, int64_t lda, const word* b, int64_t ldb,
                     int64_t columns, int64_t p_begin, int64_t p_end, bool accumulate,
                     const float* row_scale) {
  int64_t n = 0;
  for (; n + 2 * kLanes <= columns; n += 2 * kLanes)
    dot_block<kRows, 2, kColumns, kScaled>(c + n, ldc, a, lda, b + n, ldb, p_begin, p_end,
                                           accumulate, row_scale);
  if (n < columns)
    dot_block<kRows, 1, kColumns, kScaled>(c + n, ldc, a, lda, b + n, ldb, p_begin, p_end,
                                           accumulate, row_scale);
}

// C[rows x columns] (+)= A B for one block of 1..kRowBlock rows; columns a multiple of kLanes.
// kScaled: row r of the result is stored times row_scale[r]. REQUIRES: !accumulate for a bf16 C.
template <bool kColumns, bool kScaled = false, int kRows = kRowBlock, typename Out>
inline void dot_row_block(Out* c, int64_t ldc, const word* a, int64_t lda, const word* b,
                          int64_t ldb, int64_t rows, int64_t columns, int64_t p_begin,
                          int64_t p_end, bool accumulate, const float* row_scale = nullptr) {
  if constexpr (kRows > 1)
    if (rows < kRows)
      return dot_row_block<kColumns, kScaled, kRows - 1>(c, ldc, a, lda, b, ldb, rows, columns,
                                                         p_begin, p_end, accumulate, row_scale);
  dot_rows<kRows, kColumns, kScaled>(c, ldc, a, lda, b, ldb, columns, p_begin, p_end, accumulate,
                                     row_scale);
}

// Masked forms of the AVX-512 steps below, as GCC 12's plain max, scalef and shuffles warn of an
// uninitialised value.
constexpr __mmask16 kAll = 0xFFFF;

// exp(x) as fast_exp computes it (core/math/fast_exp.h) for softmax arguments x <= 0 (a score less
// its row max, so no upper clamp), 16 lanes at a time: the same range reduction and polynomial,
// the 2^n splice done by vscalefps.
inline __m512 exp_lanes(__m512 x) {
  x = _mm512_maskz_max_ps(kAll, x, _mm512_set1_ps(-87.0f));
  const __m512 round_magic = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(
      _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), round_magic), round_magic);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(kAll, p, n);
}

// The max (kMax) or the sum of the 16 lanes of v.
template <bool kMax>
inline float reduce_lanes(__m512 v) {
  const auto step = [](__m512 a, __m512 b) {
    return kMax ? _mm512_maskz_max_ps(kAll, a, b) : _mm512_add_ps(a, b);
  };
  v = step(v, _mm512_maskz_shuffle_f32x4(kAll, v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = step(v, _mm512_maskz_shuffle_f32x4(kAll, v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  v = step(v, _mm512_maskz_permute_ps(kAll, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = step(v, _mm512_maskz_permute_ps(kAll, v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_cvtss_f32(v);
}

}  // namespace ft::attention_bf16::tile

// The row-pair passes of FlashAttentionOp's AVX512-BF16 backward (backward_head in
// flash_attention_bf16_tiles.cpp): packing Q, rounding dY with D = <dY, Y>, P and dS of a query
// row pair rounded straight into their bf16 forms, and writing the gradients. Include only from
// a file compiled with AVX512-BF16 enabled, and only from one, as attention_tile_dot_bf16.h.
// Thread safety: pure functions on caller-owned buffers.
#pragma once
#if !defined(__AVX512BF16__)
#error "attention_backward_rows_bf16.h needs AVX512-BF16 enabled (-mavx512bf16)"
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/math/bf16_math.h"
#include "core/math/fast_exp.h"
#include "fusion/ops/attention_tile_dot_bf16.h"
#include "fusion/ops/flash_attention.h"

namespace ft::attention_bf16::backward_rows {

using tile::greater;
using tile::kLanes;
using tile::lesser;
using tile::round_up;
using tile::word;

// Lanes [0, n) of a vector, n clamped to [0, kLanes].
inline __mmask16 first_lanes(int64_t n) {
  return static_cast<__mmask16>((1u << lesser(kLanes, greater(0, n))) - 1);
}

// The bf16 bits of rows `even` (low 256 bits) and `odd` (high) as the pair form's words.
inline __m512i interleave_pair(__m512i bits) {
  // Word i takes bf16 element i (even row, low half) and 16 + i (odd row).
  alignas(64) static const uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                       21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                       11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), bits);
}

inline __m512i as_bits(__m512bh values) {
  __m512i bits;
  std::memcpy(&bits, &values, sizeof(bits));
  return bits;
}

// The 16 bf16 values of a 256-bit half, widened exactly to fp32. Masked forms here and below,
// as GCC 12's plain ones warn of an uninitialised value.
inline __m512 widen(__m256i bf16_values) {
  const __m512i words = _mm512_maskz_cvtepu16_epi32(0xFFFF, bf16_values);
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, words, 16));
}

// Rows ahead that backward's row-pair passes ask for. A head's rows lie a whole activation row
// (1 to 3 KiB) apart, so they fall into a few sets of L1 and evict each other: the driver's
// prefetch of the next head's rows keeps them in L2 at best, and these passes waited on nearly
// every row. 16 rows measured faster than 8 (tile::kPrefetchRows) at gpt_small.
constexpr int64_t kAheadRows = 16;

// Asks for rows t and t + 1 of rows `stride` apart, hd elements each.
template <typename Element>
inline void prefetch_pair(const Element* rows, int64_t stride, int64_t t, int64_t hd) {
  const char* even = reinterpret_cast<const char*>(rows + t * stride);
  const int64_t bytes = hd * static_cast<int64_t>(sizeof(Element));
  for (int64_t at = 0; at < bytes; at += 64) {
    __builtin_prefetch(even + at);
    __builtin_prefetch(even + stride * static_cast<int64_t>(sizeof(Element)) + at);
  }
}

// Q's rows [0, count) packed in one pass per row pair, as pack_rows (into rows_out) and
// pack_row_pairs (into pairs_out) would; asks for the rows of q, k and v kAheadRows ahead, so
// that K's and V's packing after this finds them in L2.
inline void pack_query(bf16_bits* rows_out, word* pairs_out, const bf16_bits* q, const bf16_bits* k,
                       const bf16_bits* v, const AttentionStrides& strides, int64_t count,
                       int64_t hd, int64_t width) {
  // Words 0-15 and 16-31 of a row pair's form: element i of the even row, then of the odd one.
  alignas(64) static const uint16_t kLow[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i low = _mm512_load_si512(kLow);
  const __m512i high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
  for (int64_t t = 0; t < count; t += 2) {
    if (t + kAheadRows < count) {
      prefetch_pair(q, strides.q, t + kAheadRows, hd);
      prefetch_pair(k, strides.k, t + kAheadRows, hd);
      prefetch_pair(v, strides.v, t + kAheadRows, hd);
    }
    const bool odd = t + 1 < count;
    const bf16_bits* even_row = q + t * strides.q;
    for (int64_t d = 0; d < width; d += 2 * kLanes) {
      const __mmask32 lanes =
          static_cast<__mmask32>((uint64_t{1} << lesser(2 * kLanes, greater(0, hd - d))) - 1);
      const __mmask32 stored =
          static_cast<__mmask32>((uint64_t{1} << lesser(2 * kLanes, width - d)) - 1);
      const __m512i even = _mm512_maskz_loadu_epi16(lanes, even_row + d);
      const __m512i odd_bits =
          _mm512_maskz_loadu_epi16(odd ? lanes : 0, even_row + (odd ? strides.q : 0) + d);
      _mm512_mask_storeu_epi16(rows_out + t * width + d, stored, even);
      if (odd) _mm512_mask_storeu_epi16(rows_out + (t + 1) * width + d, stored, odd_bits);
      word* pair = pairs_out + t / 2 * width + d;
      _mm512_storeu_si512(pair, _mm512_permutex2var_epi16(even, low, odd_bits));
      if (d + kLanes < width)
        _mm512_storeu_si512(pair + kLanes, _mm512_permutex2var_epi16(even, high, odd_bits));
    }
  }
}

// Y's lanes as fp32: an fp32 Y as it is, a bf16 one widened (exact).
inline __m512 load_lanes(__mmask16 lanes, const float* at) {
  return _mm512_maskz_loadu_ps(lanes, at);
}
inline __m512 load_lanes(__mmask16 lanes, const bf16_bits* at) {
  return widen(_mm256_maskz_loadu_epi16(lanes, at));
}

// dY's rows [0, count) (fp32, `stride` apart) rounded to bf16, in one pass per row pair: into
// rows[t][0, width) and pairs[t / 2][0, width), zero padded past hd, and dots[t] = <dY_t, Y_t> on
// the rounded dY and the Y forward wrote (fp32, or bf16 widened); asks for the rows kAheadRows
// ahead.
template <typename Y>
inline void round_dy(bf16_bits* rows, word* pairs, float* dots, const float* dy, const Y* y,
                     int64_t stride, int64_t count, int64_t hd, int64_t width) {
  for (int64_t t = 0; t < count; t += 2) {
    const bool odd = t + 1 < count;
    const float* dy_even = dy + t * stride;
    const Y* y_even = y + t * stride;
    // The odd row of a last, unpaired row reads the even row again under an empty mask.
    const int64_t next = odd ? stride : 0;
    if (t + kAheadRows < count) {
      prefetch_pair(dy, stride, t + kAheadRows, hd);
      prefetch_pair(y, stride, t + kAheadRows, hd);
    }
    __m512 dot_even = _mm512_setzero_ps(), dot_odd = _mm512_setzero_ps();
    for (int64_t d = 0; d < width; d += kLanes) {
      const __mmask16 lanes = first_lanes(hd - d), odd_lanes = odd ? lanes : 0;
      const __m512i bits =
          as_bits(_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(odd_lanes, dy_even + next + d),
                                      _mm512_maskz_loadu_ps(lanes, dy_even + d)));
      const __m256i even_bits = _mm512_maskz_extracti64x4_epi64(0xF, bits, 0);
      const __m256i odd_bits = _mm512_maskz_extracti64x4_epi64(0xF, bits, 1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(rows + t * width + d), even_bits);
      if (odd)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(rows + (t + 1) * width + d), odd_bits);
      _mm512_storeu_si512(pairs + t / 2 * width + d, interleave_pair(bits));
      dot_even = _mm512_fmadd_ps(widen(even_bits), load_lanes(lanes, y_even + d), dot_even);
      dot_odd = _mm512_fmadd_ps(widen(odd_bits), load_lanes(odd_lanes, y_even + next + d), dot_odd);
    }
    dots[t] = tile::reduce_lanes<false>(dot_even);
    if (odd) dots[t + 1] = tile::reduce_lanes<false>(dot_odd);
  }
}

// One query row's inputs to P and dS: its scores S and dP (fp32), how many keys it sees, its
// log-sum-exp and D = <dY, Y>.
struct WeightRow {
  const float *scores, *dprobs;
  int64_t count;
  float lse, dot;
};

// P = exp(scale S - L) and dS = P (dP - D) of a query row pair, columns [0, extent) (zeros from
// each row's count on), rounded to bf16 as soon as computed: P into its row-pair form, dS into
// its row-pair form and its two rows. One pass, chunk by chunk, so the fp32 P and dS never reach
// memory.
inline void pair_weights(word* p_pairs, word* ds_pairs, bf16_bits* ds_even, bf16_bits* ds_odd,
                         const WeightRow& even, const WeightRow& odd, int64_t extent, float scale) {
  const auto store = [&](int64_t s0, __m512i p_bits, __m512i ds_bits) {
    _mm512_storeu_si512(p_pairs + s0, interleave_pair(p_bits));
    _mm512_storeu_si512(ds_pairs + s0, interleave_pair(ds_bits));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ds_even + s0),
                        _mm512_maskz_extracti64x4_epi64(0xF, ds_bits, 0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ds_odd + s0),
                        _mm512_maskz_extracti64x4_epi64(0xF, ds_bits, 1));
  };
  // Chunks past both rows' keys only take zeros (up to a chunk per pair, ~10% of the exps).
  const int64_t seen = lesser(extent, round_up(greater(even.count, odd.count), kLanes));
  int64_t s0 = 0;
  for (; s0 < seen; s0 += kLanes) {
    // Lane l of row i in [i][l]; the selects (not masks on the inputs) zero what a row does not
    // see, past the columns its scores hold.
    alignas(64) float p[2][kLanes], ds[2][kLanes];
    const WeightRow* both[2] = {&even, &odd};
    for (int i = 0; i < 2; ++i) {
      const WeightRow& row = *both[i];
      const float* s_row = row.scores + s0;
      const float* dp_row = row.dprobs + s0;
      const int visible = static_cast<int>(row.count - s0);
      const float lse = row.lse, dot = row.dot;
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) {
        const float weight = l < visible ? fast_exp(scale * s_row[l] - lse) : 0.0f;
        p[i][l] = weight;
        ds[i][l] = l < visible ? weight * (dp_row[l] - dot) : 0.0f;
      }
    }
    store(s0, as_bits(_mm512_cvtne2ps_pbh(_mm512_load_ps(p[1]), _mm512_load_ps(p[0]))),
          as_bits(_mm512_cvtne2ps_pbh(_mm512_load_ps(ds[1]), _mm512_load_ps(ds[0]))));
  }
  for (; s0 < extent; s0 += kLanes) store(s0, _mm512_setzero_si512(), _mm512_setzero_si512());
}

// rows[t][0, hd) (+)= factor * sums[t][0, hd) for t < count: `=` when `overwrite`. Rows it
// overwrites whole vectors at a time from a 64-byte boundary are streamed past the caches: a
// plain store first read each line of the gradient (a whole activation row apart) from memory,
// ~20% of backward_head at gpt_small. REQUIRES: _mm_sfence() before another thread reads them.
inline void add_scaled(float* rows, int64_t stride, const float* sums, int64_t width, int64_t count,
                       int64_t hd, float factor, bool overwrite) {
  for (int64_t t = 0; t < count; ++t) {
    float* row = rows + t * stride;
    const float* sum = sums + t * width;
    if (overwrite && hd % kLanes == 0 && reinterpret_cast<uintptr_t>(row) % 64 == 0) {
      for (int64_t d = 0; d < hd; d += kLanes)
        _mm512_stream_ps(row + d, _mm512_mul_ps(_mm512_set1_ps(factor), _mm512_load_ps(sum + d)));
    } else if (overwrite) {
#pragma omp simd
      for (int64_t d = 0; d < hd; ++d) row[d] = factor * sum[d];
    } else {
#pragma omp simd
      for (int64_t d = 0; d < hd; ++d) row[d] += factor * sum[d];
    }
  }
}

}  // namespace ft::attention_bf16::backward_rows

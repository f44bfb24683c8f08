// Online softmax (Milakov & Gimelshein 2018): the normaliser of softmax(x) over a row that
// arrives in pieces (key tiles of attention, a thread's strided share of a logit row), in one
// pass, without knowing the row maximum up front. The state after the pieces seen so far is
//   max = m = max_i x_i,   sum = l = sum_i exp(x_i - m).
// When a piece with maximum m_p arrives, m' = max(m, m_p) and every term accumulated so far was
// weighted by exp(x - m); it becomes exp(x - m') by the factor exp(m - m') <= 1, which the caller
// also applies to anything else it accumulated with those weights (attention's output row). Then
//   l' = l exp(m - m') + sum_{i in piece} exp(x_i - m'),   logsumexp = m + log l.
// Shared by the CPU and CUDA kernels of FlashAttentionOp (fusion/ops/flash_attention.*) and the
// CUDA ClassifierOp (fusion/ops/classifier.cu), so the CPU tests (tests/attention_math_test.cpp)
// cover the GPU's math.
// Thread safety: pure functions on a caller-owned state.
#pragma once
#include <cmath>

#include "core/hd.h"
#include "core/math/fast_exp.h"

namespace ft {

struct OnlineSoftmax {
  float max = -INFINITY;  // m: nothing seen yet
  float sum = 0.0f;       // l
};

FT_HD float online_softmax_exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}

// Raises state.max to max(state.max, piece_max) and returns the factor exp(m - m') for every term
// accumulated so far. A piece with no finite entry (piece_max = -inf, every key masked) changes
// nothing and returns 1, where exp(-inf - -inf) would be NaN.
FT_HD float online_softmax_rescale(OnlineSoftmax& state, float piece_max) {
  const float new_max = state.max < piece_max ? piece_max : state.max;
  if (new_max == -INFINITY) return 1.0f;
  const float rescale = online_softmax_exp(state.max - new_max);
  state.max = new_max;
  return rescale;
}

// The weight exp(x - m') of one entry of the piece, after online_softmax_rescale: the vectorisable
// exp, as every softmax of the CPU kernels uses.
FT_HD float online_softmax_weight(float x, float running_max) {
  return fast_exp(x - running_max);
}

// l' = l * rescale + piece_sum, piece_sum being the sum of the piece's weights, rescale the value
// online_softmax_rescale returned for this piece.
FT_HD void online_softmax_accumulate(OnlineSoftmax& state, float rescale, float piece_sum) {
  state.sum = state.sum * rescale + piece_sum;
}

// One entry as a piece of its own (a thread walking a row one element at a time).
FT_HD void online_softmax_add(OnlineSoftmax& state, float x) {
  const float rescale = online_softmax_rescale(state, x);
  online_softmax_accumulate(state, rescale, online_softmax_weight(x, state.max));
}

// The state of the union of two disjoint sets of entries (a parallel reduction's step):
// m = max(m_a, m_b), l = l_a exp(m_a - m) + l_b exp(m_b - m). An empty side contributes 0.
FT_HD OnlineSoftmax online_softmax_merge(const OnlineSoftmax& a, const OnlineSoftmax& b) {
  OnlineSoftmax merged;
  merged.max = a.max < b.max ? b.max : a.max;
  if (merged.max == -INFINITY) return merged;
  const float a_part = a.max == -INFINITY ? 0.0f : a.sum * online_softmax_exp(a.max - merged.max);
  const float b_part = b.max == -INFINITY ? 0.0f : b.sum * online_softmax_exp(b.max - merged.max);
  merged.sum = a_part + b_part;
  return merged;
}

// log sum_i exp(x_i) = m + log l. REQUIRES: at least one finite entry was seen.
FT_HD float online_softmax_log_sum_exp(const OnlineSoftmax& state) {
#if defined(__CUDA_ARCH__)
  return state.max + logf(state.sum);
#else
  return state.max + std::log(state.sum);
#endif
}

}  // namespace ft

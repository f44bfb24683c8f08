// The online softmax of kernels/online_softmax.h, which FlashAttentionOp's CPU and CUDA kernels
// and the CUDA classifier share, against a two-pass softmax in double: rows fed in pieces (key
// tiles) whose maximum grows, shrinks and jumps, an attention-style output row rescaled with the
// returned factor, one entry at a time, merges of partial states (the GPU's reductions), fully
// masked pieces, and logits large enough that a naive exp overflows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/online_softmax.h"

namespace ft {
namespace {

// log sum_i exp(x_i) in double, two passes (max, then the sum).
double reference_log_sum_exp(const std::vector<float>& x) {
  double max_x = -INFINITY;
  for (float value : x) max_x = std::max(max_x, static_cast<double>(value));
  double sum = 0.0;
  for (float value : x) sum += std::exp(value - max_x);
  return max_x + std::log(sum);
}

// sum_i softmax(x)_i v_i in double.
double reference_weighted_mean(const std::vector<float>& x, const std::vector<float>& v) {
  const double lse = reference_log_sum_exp(x);
  double out = 0.0;
  for (size_t i = 0; i < x.size(); ++i) out += std::exp(x[i] - lse) * v[i];
  return out;
}

struct TiledResult {
  OnlineSoftmax state;
  float out = 0.0f;  // the attention-style accumulator: sum_i exp(x_i - m) v_i
};

// Feeds x in consecutive pieces of the given sizes exactly as the attention kernels do: the
// piece max, rescale (of the sum and of `out`), the weights against the new max, accumulate.
TiledResult feed_in_pieces(const std::vector<float>& x, const std::vector<float>& v,
                           const std::vector<size_t>& piece_sizes) {
  TiledResult result;
  size_t begin = 0;
  for (size_t size : piece_sizes) {
    float piece_max = -INFINITY;
    for (size_t i = begin; i < begin + size; ++i) piece_max = std::max(piece_max, x[i]);
    const float rescale = online_softmax_rescale(result.state, piece_max);
    float piece_sum = 0.0f;
    result.out *= rescale;
    for (size_t i = begin; i < begin + size; ++i) {
      const float weight = online_softmax_weight(x[i], result.state.max);
      piece_sum += weight;
      result.out += weight * v[i];
    }
    online_softmax_accumulate(result.state, rescale, piece_sum);
    begin += size;
  }
  EXPECT_EQ(begin, x.size());
  return result;
}

// Four pieces whose maxima are 1, 6 (grows), 2 (shrinks), 9 (grows past every earlier entry),
// then -4 (shrinks far): every rescale path the kernels take.
struct Row {
  std::vector<float> x, v;
  std::vector<size_t> pieces;
};
Row growing_and_shrinking_row() {
  Row row;
  row.x = {0.5f,  1.0f,  -2.0f,  // max 1
           6.0f,  3.0f,          // max 6
           2.0f,  -1.0f, 0.0f,   // max 2
           9.0f,  8.5f,          // max 9
           -4.0f, -7.0f};        // max -4
  row.pieces = {3, 2, 3, 2, 2};
  for (size_t i = 0; i < row.x.size(); ++i) row.v.push_back(std::sin(1.7f * i) + 0.25f * i);
  return row;
}

TEST(OnlineSoftmaxTest, PiecesWhoseMaxGrowsAndShrinksMatchTwoPassSoftmax) {
  const Row row = growing_and_shrinking_row();
  const TiledResult result = feed_in_pieces(row.x, row.v, row.pieces);
  EXPECT_EQ(result.state.max, 9.0f);
  EXPECT_NEAR(online_softmax_log_sum_exp(result.state), reference_log_sum_exp(row.x), 2e-6);
  EXPECT_NEAR(result.out / result.state.sum, reference_weighted_mean(row.x, row.v), 2e-6);
}

TEST(OnlineSoftmaxTest, PieceSizesDoNotChangeTheResult) {
  const Row row = growing_and_shrinking_row();
  const double lse = reference_log_sum_exp(row.x), mean = reference_weighted_mean(row.x, row.v);
  for (const std::vector<size_t>& pieces :
       {std::vector<size_t>{12}, std::vector<size_t>(12, 1), std::vector<size_t>{5, 7},
        std::vector<size_t>{1, 10, 1}}) {
    const TiledResult result = feed_in_pieces(row.x, row.v, pieces);
    EXPECT_NEAR(online_softmax_log_sum_exp(result.state), lse, 2e-6) << pieces.size() << " pieces";
    EXPECT_NEAR(result.out / result.state.sum, mean, 2e-6) << pieces.size() << " pieces";
  }
}

TEST(OnlineSoftmaxTest, OneEntryAtATimeMatchesTwoPassSoftmax) {
  const Row row = growing_and_shrinking_row();
  OnlineSoftmax state;
  for (float value : row.x) online_softmax_add(state, value);
  EXPECT_EQ(state.max, 9.0f);
  EXPECT_NEAR(online_softmax_log_sum_exp(state), reference_log_sum_exp(row.x), 2e-6);
}

TEST(OnlineSoftmaxTest, MergedPartialStatesMatchTwoPassSoftmax) {
  const Row row = growing_and_shrinking_row();
  // Strided shares, as a block's threads read a logit row, merged pairwise in a tree.
  for (size_t shares : {2u, 3u, 5u, 16u}) {
    std::vector<OnlineSoftmax> partial(shares);  // shares past the row's length stay empty
    for (size_t i = 0; i < row.x.size(); ++i) online_softmax_add(partial[i % shares], row.x[i]);
    while (partial.size() > 1) {
      std::vector<OnlineSoftmax> next;
      for (size_t i = 0; i < partial.size(); i += 2)
        next.push_back(i + 1 < partial.size() ? online_softmax_merge(partial[i], partial[i + 1])
                                              : partial[i]);
      partial = next;
    }
    EXPECT_EQ(partial[0].max, 9.0f) << shares;
    EXPECT_NEAR(online_softmax_log_sum_exp(partial[0]), reference_log_sum_exp(row.x), 2e-6)
        << shares << " shares";
  }
}

TEST(OnlineSoftmaxTest, MergeIsSymmetricBitForBit) {
  OnlineSoftmax a, b;
  for (float value : {1.0f, 4.0f, -2.0f}) online_softmax_add(a, value);
  for (float value : {3.5f, 0.25f}) online_softmax_add(b, value);
  const OnlineSoftmax ab = online_softmax_merge(a, b), ba = online_softmax_merge(b, a);
  EXPECT_EQ(ab.max, ba.max);
  EXPECT_EQ(ab.sum, ba.sum);  // the GPU's butterfly leaves every lane the same state
}

TEST(OnlineSoftmaxTest, EmptyAndFullyMaskedPiecesChangeNothing) {
  OnlineSoftmax empty;
  const OnlineSoftmax merged_empty = online_softmax_merge(empty, empty);
  EXPECT_EQ(merged_empty.max, -INFINITY);
  EXPECT_EQ(merged_empty.sum, 0.0f);
  EXPECT_EQ(online_softmax_rescale(empty, -INFINITY), 1.0f);  // not exp(-inf - -inf) = NaN
  EXPECT_EQ(empty.max, -INFINITY);

  OnlineSoftmax state;
  for (float value : {2.0f, -1.0f}) online_softmax_add(state, value);
  const OnlineSoftmax before = state;
  EXPECT_EQ(online_softmax_rescale(state, -INFINITY), 1.0f);
  online_softmax_accumulate(state, 1.0f, 0.0f);
  EXPECT_EQ(state.max, before.max);
  EXPECT_EQ(state.sum, before.sum);
  const OnlineSoftmax with_empty = online_softmax_merge(empty, state);
  EXPECT_EQ(with_empty.max, state.max);
  EXPECT_EQ(with_empty.sum, state.sum);
}

TEST(OnlineSoftmaxTest, LargeLogitsStayFinite) {
  // exp(100) overflows a float; every weight here is exp(x - m) <= 1.
  const std::vector<float> x = {100.0f, 95.0f, 120.0f, 60.0f, 119.0f};
  const std::vector<float> v = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  const TiledResult result = feed_in_pieces(x, v, {2, 1, 2});
  EXPECT_TRUE(std::isfinite(result.state.sum));
  EXPECT_NEAR(online_softmax_log_sum_exp(result.state), reference_log_sum_exp(x), 2e-5);
  EXPECT_NEAR(result.out / result.state.sum, reference_weighted_mean(x, v), 2e-6);
}

}  // namespace
}  // namespace ft

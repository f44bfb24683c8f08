// Tests for GptDecoder with bf16 GEMMs (model/gpt_decode.h, `sample --precision bf16`): it is the
// eval graph built with gemm_dtype bf16 at every position, it stays within bf16 rounding of the
// fp32 decoder while differing from it, and it refuses parameters without fresh bf16 copies.
// ctest runs it again with oneDNN capped at AVX2 (the widening path of CPUs without bf16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "core/check.h"
#include "core/gemm.h"
#include "core/rng.h"
#include "model/executor.h"
#include "model/gpt.h"
#include "model/gpt_decode.h"
#include "tests/gpt_decode_test_util.h"

namespace ft {
namespace {

using namespace decode_test;

// The bf16 decoder, one token at a time and in chunks, against the bf16 graph: the same casts of
// the same values, so only fp32 summation order can differ (GEMMs of a few rows against GEMMs of
// the window), which could put an fp32 value on the other side of a bf16 rounding boundary now and
// then. Measured: 0 with oneDNN's bf16 kernels, 1.2e-7 on the widening path (AVX2). Leaving out any
// one cast of the graph (of v alone, or of the softmax weights alone) moves the logits by 2e-3 to
// 7e-3, 10x over the bound.
void check_bf16_decoder_matches_bf16_graph(bool qk_norm) {
  Model model(qk_norm, DType::kBF16);
  const int T = model.shape.seq_len, V = model.shape.vocab_size;
  const std::vector<int32_t> tokens = random_tokens(T, 21);
  const std::vector<float> full = model.full_window_logits(tokens);
  GptDecoder decoder(model.shape, model.ids, model.params, DType::kBF16);
  EXPECT_EQ(decoder.gemm_dtype(), DType::kBF16);
  double worst = 0.0;
  for (int t = 0; t < T; ++t) {
    const double error = relative_error(decoder.append(&tokens[t], 1), &full[t * V], V);
    EXPECT_LT(error, 2e-4) << "position " << t;
    worst = std::max(worst, error);
  }
  decoder.reset();
  int done = 0;
  for (int chunk : {5, 1, 7, 3}) {
    const float* logits = decoder.append(&tokens[done], chunk);
    done += chunk;
    const double error = relative_error(logits, &full[(done - 1) * V], V);
    EXPECT_LT(error, 2e-4) << "chunk ending " << done;
    worst = std::max(worst, error);
  }
  std::printf("  qk_norm %d: bf16 decoder vs bf16 graph, worst relative logit error %.2e (%s)\n",
              qk_norm, worst, bf16_gemm_path());
}

TEST(GptDecoderBf16, MatchesTheBf16EvalGraphAtEveryPosition) {
  check_bf16_decoder_matches_bf16_graph(false);
}

TEST(GptDecoderBf16, MatchesTheBf16EvalGraphWithQkNorm) {
  check_bf16_decoder_matches_bf16_graph(true);
}

// bf16 operands carry 8 significant bits (relative rounding up to 2^-9 = 2e-3 per operand), so
// the logits move by a few times that, well under 5e-2 of the largest logit; they do move (over
// 1e-3), or the decoder did not multiply bf16 operands. Where fp32's best byte leads the runner-up
// by more than that bound, greedy decoding picks the same byte.
TEST(GptDecoderBf16, StaysWithinBf16RoundingOfFp32) {
  Model model(false, DType::kF32);
  const int T = model.shape.seq_len, V = model.shape.vocab_size;
  const std::vector<int32_t> tokens = random_tokens(T, 33);
  GptDecoder fp32(model.shape, model.ids, model.params, DType::kF32);
  GptDecoder bf16(model.shape, model.ids, model.params, DType::kBF16);
  double worst = 0.0;
  int greedy_checked = 0;
  for (int t = 0; t < T; ++t) {
    const float* fp32_logits = fp32.append(&tokens[t], 1);
    const std::vector<float> expected(fp32_logits, fp32_logits + V);
    const float* logits = bf16.append(&tokens[t], 1);
    const double error = relative_error(logits, expected.data(), V);
    EXPECT_LT(error, 5e-2) << "position " << t;
    worst = std::max(worst, error);
    std::vector<float> sorted = expected;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    double scale = 0.0;
    for (float value : expected) scale = std::max(scale, std::fabs(static_cast<double>(value)));
    if (sorted[0] - sorted[1] <= 2 * error * scale) continue;  // a near-tie either may break
    ++greedy_checked;
    EXPECT_EQ(std::max_element(logits, logits + V) - logits,
              std::max_element(expected.begin(), expected.end()) - expected.begin())
        << "position " << t;
  }
  std::printf(
      "  bf16 vs fp32 decoder: worst relative logit error %.2e, greedy byte compared at "
      "%d of %d positions (%s)\n",
      worst, greedy_checked, T, bf16_gemm_path());
  EXPECT_GT(worst, 1e-3) << "bf16 GEMMs that round nothing";
  EXPECT_GE(greedy_checked, T / 2);
}

TEST(GptDecoderBf16, RefusesMissingOrStaleBf16Copies) {
  const GptShape shape = small_shape(false);
  ParamStore fp32_only;
  const GptParamIds ids = register_gpt_params(shape, fp32_only);
  fp32_only.allocate();
  try {
    GptDecoder decoder(shape, ids, fp32_only, DType::kBF16);
    ADD_FAILURE() << "a bf16 decoder over parameters without bf16 copies was built";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("enable_bf16_copies"), std::string::npos)
        << error.what();
  }

  Model model(false, DType::kBF16);
  GptDecoder decoder(model.shape, model.ids, model.params, DType::kBF16);
  const int32_t token = 7;
  decoder.append(&token, 1);
  model.params.mark_changed();  // e.g. new weights loaded into the values
  decoder.reset();
  try {
    decoder.append(&token, 1);
    ADD_FAILURE() << "append() multiplied stale bf16 copies";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("refresh_bf16_copies"), std::string::npos)
        << error.what();
  }
  model.params.refresh_bf16_copies();
  EXPECT_NO_THROW(decoder.append(&token, 1));
}

}  // namespace
}  // namespace ft

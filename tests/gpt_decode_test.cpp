// Tests for model/gpt_decode.h and model/gpt_sample.h: the KV-cache decoder against the eval
// graph of build_gpt_graph at every position (with and without qk_norm, one token at a time and in
// chunks), the window policy against the graph after re-primes, KV cache against recompute, and
// the sampler (seeded repeatability, greedy, top-k, the drawn distribution).
#include "model/gpt_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "model/executor.h"
#include "model/gpt.h"
#include "model/gpt_sample.h"
#include "tests/gpt_decode_test_util.h"

namespace ft {
namespace {

using namespace decode_test;

int32_t argmax(const float* logits, int vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

void check_decoder_matches_graph(bool qk_norm) {
  Model model(qk_norm);
  const int T = model.shape.seq_len, V = model.shape.vocab_size;
  const std::vector<int32_t> tokens = random_tokens(T, 21);
  const std::vector<float> full = model.full_window_logits(tokens);
  GptDecoder decoder(model.shape, model.ids, model.params);

  // One token at a time: position t sees the cache of positions 0..t-1.
  double worst = 0.0;
  for (int t = 0; t < T; ++t) {
    const double error = relative_error(decoder.append(&tokens[t], 1), &full[t * V], V);
    EXPECT_LT(error, 1e-5) << "position " << t;
    worst = std::max(worst, error);
  }
  std::printf("  qk_norm %d: worst relative logit error %.2e over %d positions\n", qk_norm, worst,
              T);
  EXPECT_EQ(decoder.cached_positions(), T);

  // Chunks (a prompt, then single tokens and more chunks): the batched path writes the cache rows
  // the later positions read.
  decoder.reset();
  int done = 0;
  for (int chunk : {5, 1, 7, 3}) {
    const float* logits = decoder.append(&tokens[done], chunk);
    done += chunk;
    EXPECT_LT(relative_error(logits, &full[(done - 1) * V], V), 1e-5) << "chunk ending " << done;
  }
  EXPECT_EQ(done, T);
  EXPECT_THROW(decoder.append(&tokens[0], 1), Error) << "a full cache must refuse more";
}

TEST(GptDecoderTest, KvCacheLogitsEqualFullWindowAtEveryPosition) {
  check_decoder_matches_graph(false);
}
TEST(GptDecoderTest, KvCacheLogitsEqualFullWindowAtEveryPositionWithQkNorm) {
  check_decoder_matches_graph(true);
}

GenerateResult run(Model& model, const std::vector<int32_t>& prompt, int new_tokens,
                   float temperature, int top_k, uint64_t seed,
                   DecodeMode mode = DecodeMode::kKvCache) {
  GptDecoder decoder(model.shape, model.ids, model.params);
  GenerateOptions options;
  options.max_new_tokens = new_tokens;
  options.sampling.temperature = temperature;
  options.sampling.top_k = top_k;
  options.seed = seed;
  options.mode = mode;
  return generate(decoder, prompt, options);
}

TEST(GptSampleTest, SameSeedSameTextOtherSeedOtherText) {
  Model model(true);
  const std::vector<int32_t> prompt = random_tokens(3, 31);
  const GenerateResult first = run(model, prompt, 40, 1.0f, 0, 7);
  const GenerateResult again = run(model, prompt, 40, 1.0f, 0, 7);
  const GenerateResult other = run(model, prompt, 40, 1.0f, 0, 8);
  ASSERT_EQ(first.new_tokens.size(), 40u);
  EXPECT_EQ(first.new_tokens, again.new_tokens);
  EXPECT_NE(first.new_tokens, other.new_tokens);
  EXPECT_GT(first.reprimes, 0) << "40 tokens past a 3-token prompt must cross seq_len 16";
}

// Greedy decoding across re-primes: every token is the argmax of the graph's logits over its
// context window, which this test derives independently: the window grows from the prompt and,
// when it would pass seq_len, keeps its last seq_len / 2 tokens.
TEST(GptSampleTest, GreedyIsArgmaxOfFullWindowLogitsAcrossReprimes) {
  for (bool qk_norm : {false, true}) {
    Model model(qk_norm);
    const int T = model.shape.seq_len, V = model.shape.vocab_size;
    const std::vector<int32_t> prompt = random_tokens(4, 41);
    const GenerateResult result = run(model, prompt, 45, 0.0f, 0, 1);
    ASSERT_EQ(result.new_tokens.size(), 45u);
    std::vector<int32_t> window = prompt;
    int cuts = 0;
    for (size_t n = 0; n < result.new_tokens.size(); ++n) {
      if (n > 0) {
        window.push_back(result.new_tokens[n - 1]);
        if (static_cast<int>(window.size()) > T) {
          window.erase(window.begin(), window.end() - T / 2);
          ++cuts;
        }
      }
      const std::vector<float> full = model.full_window_logits(window);
      const int last = static_cast<int>(window.size()) - 1;
      EXPECT_EQ(result.new_tokens[n], argmax(&full[last * V], V))
          << "token " << n << ", qk_norm " << qk_norm;
    }
    EXPECT_EQ(result.reprimes, cuts);
    EXPECT_GE(cuts, 2);
  }
}

TEST(GptSampleTest, KvCacheAndRecomputeGiveTheSameTextAndCacheCostsFewerPositions) {
  Model model(false);
  const std::vector<int32_t> prompt = random_tokens(2, 51);
  for (float temperature : {0.0f, 0.8f}) {
    const GenerateResult cached = run(model, prompt, 50, temperature, 20, 3);
    const GenerateResult recomputed =
        run(model, prompt, 50, temperature, 20, 3, DecodeMode::kRecompute);
    EXPECT_EQ(cached.new_tokens, recomputed.new_tokens) << "temperature " << temperature;
    EXPECT_EQ(cached.reprimes, recomputed.reprimes);
    // With the cache: the prompt, one position per further token, and each re-prime's window.
    EXPECT_EQ(cached.positions_computed, 2 + 49 + cached.reprimes * (8 - 1));
    EXPECT_GT(recomputed.positions_computed, 4 * cached.positions_computed);
  }
}

TEST(GptSampleTest, TopOneIsGreedyAndTopKDrawsOnlyTheKLargest) {
  Model model(false);
  const std::vector<int32_t> prompt = random_tokens(5, 61);
  EXPECT_EQ(run(model, prompt, 30, 1.0f, 1, 9).new_tokens,
            run(model, prompt, 30, 0.0f, 0, 9).new_tokens);

  std::vector<float> logits(256);
  Rng values(5);
  for (float& logit : logits) logit = values.normal();
  std::vector<int32_t> order(256);
  for (int i = 0; i < 256; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  const std::vector<int32_t> top3(order.begin(), order.begin() + 3);
  Rng rng(6);
  std::vector<int> seen(256, 0);
  for (int draw = 0; draw < 3000; ++draw)
    ++seen[sample_next_token(logits.data(), 256, {2.0f, 3}, rng)];
  for (int i = 0; i < 256; ++i) {
    const bool in_top3 = std::find(top3.begin(), top3.end(), i) != top3.end();
    if (in_top3)
      EXPECT_GT(seen[i], 0) << "top-3 token " << i << " never drawn";
    else
      EXPECT_EQ(seen[i], 0) << "token " << i << " is outside the top 3";
  }
}

// logits (0, ln 3) at temperature 1 give probabilities (1/4, 3/4); at temperature 2,
// (1 / (1 + sqrt 3), sqrt 3 / (1 + sqrt 3)) = (0.366, 0.634).
TEST(GptSampleTest, DrawsFollowTheTemperedSoftmax) {
  const float logits[2] = {0.0f, std::log(3.0f)};
  for (float temperature : {1.0f, 2.0f}) {
    Rng rng(99);
    int ones = 0;
    const int draws = 20000;
    for (int draw = 0; draw < draws; ++draw)
      ones += sample_next_token(logits, 2, {temperature, 0}, rng);
    const double expected = temperature == 1.0f ? 0.75 : std::sqrt(3.0) / (1.0 + std::sqrt(3.0));
    EXPECT_NEAR(static_cast<double>(ones) / draws, expected, 0.015)
        << "temperature " << temperature;
  }
}

TEST(GptSampleTest, BadOptionsAreRefused) {
  const float logits[2] = {0.0f, 1.0f};
  Rng rng(1);
  EXPECT_THROW(sample_next_token(logits, 2, {-1.0f, 0}, rng), Error);
  EXPECT_THROW(sample_next_token(logits, 2, {1.0f, -1}, rng), Error);
  EXPECT_THROW(sample_next_token(logits, 2, {1.0f, 3}, rng), Error);
  EXPECT_THROW(sample_next_token(logits, 2, {NAN, 0}, rng), Error);
}

}  // namespace
}  // namespace ft

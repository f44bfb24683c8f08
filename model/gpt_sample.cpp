// Token sampling and the generation loop (see gpt_sample.h).
#include "model/gpt_sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "core/timer.h"

namespace ft {

int32_t sample_next_token(const float* logits, int vocab_size, const SamplingOptions& options,
                          Rng& rng) {
  FT_CHECK(vocab_size >= 1, "sample_next_token: vocab_size ", vocab_size);
  FT_CHECK(std::isfinite(options.temperature) && options.temperature >= 0.0f,
           "sample_next_token: temperature ", options.temperature);
  FT_CHECK(options.top_k >= 0 && options.top_k <= vocab_size, "sample_next_token: top_k ",
           options.top_k, " outside [0, ", vocab_size, "]");
  // A NaN would break the strict ordering below; a model that produces one is broken anyway.
  for (int i = 0; i < vocab_size; ++i)
    FT_CHECK(std::isfinite(logits[i]), "sample_next_token: logit ", i, " is ", logits[i]);
  const int32_t best = static_cast<int32_t>(std::max_element(logits, logits + vocab_size) - logits);
  if (options.temperature == 0.0f) return best;

  std::vector<int32_t> kept(vocab_size);
  std::iota(kept.begin(), kept.end(), 0);
  if (options.top_k > 0 && options.top_k < vocab_size) {
    // Larger logit first, lower index on ties: a strict total order, so the kept set does not
    // depend on the library's nth_element.
    auto ranks_higher = [logits](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    std::nth_element(kept.begin(), kept.begin() + options.top_k, kept.end(), ranks_higher);
    kept.resize(options.top_k);
    std::sort(kept.begin(), kept.end());  // walk the cumulative sums in index order
  }
  // softmax(l / T) up to its normaliser; subtracting the max keeps exp() in range.
  std::vector<double> weights(kept.size());
  double total = 0.0;
  for (size_t i = 0; i < kept.size(); ++i) {
    weights[i] = std::exp((static_cast<double>(logits[kept[i]]) - logits[best]) /
                          static_cast<double>(options.temperature));
    total += weights[i];
  }
  // 53 random bits: a uniform in [0, 1) as fine as a double resolves.
  const double target =
      static_cast<double>(rng.next_u64() >> 11) * (1.0 / 9007199254740992.0) * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < kept.size(); ++i) {
    cumulative += weights[i];
    if (target < cumulative) return kept[i];
  }
  return kept.back();  // target == total after rounding
}

int reprime_keep(int seq_len) {
  return std::max(1, seq_len / 2);
}

GenerateResult generate(GptDecoder& decoder, const std::vector<int32_t>& prompt,
                        const GenerateOptions& options) {
  const int capacity = decoder.capacity();
  FT_CHECK(!prompt.empty() && static_cast<int>(prompt.size()) <= capacity, "generate: prompt of ",
           prompt.size(), " tokens, the model holds 1 to ", capacity);
  FT_CHECK(options.max_new_tokens >= 1, "generate: max_new_tokens ", options.max_new_tokens);
  Rng rng(options.seed);
  GenerateResult result;
  result.new_tokens.reserve(options.max_new_tokens);
  const double start_ms = now_ms();

  std::vector<int32_t> window = prompt;
  decoder.reset();
  const float* logits = decoder.append(window.data(), static_cast<int>(window.size()));
  result.positions_computed += static_cast<int64_t>(window.size());
  for (int n = 0; n < options.max_new_tokens; ++n) {
    const int32_t token = sample_next_token(logits, decoder.vocab_size(), options.sampling, rng);
    result.new_tokens.push_back(token);
    if (n + 1 == options.max_new_tokens) break;  // nothing predicts past the last token
    window.push_back(token);
    const bool cut = static_cast<int>(window.size()) > capacity;
    if (cut) {
      window.erase(window.begin(), window.end() - reprime_keep(capacity));
      ++result.reprimes;
    }
    if (options.mode == DecodeMode::kRecompute || cut) {
      decoder.reset();
      logits = decoder.append(window.data(), static_cast<int>(window.size()));
      result.positions_computed += static_cast<int64_t>(window.size());
    } else {
      logits = decoder.append(&token, 1);
      result.positions_computed += 1;
    }
  }
  result.seconds = (now_ms() - start_ms) / 1000.0;
  return result;
}

}  // namespace ft

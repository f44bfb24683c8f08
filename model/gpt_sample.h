// Autoregressive text generation on a GptDecoder: drawing the next token from logits
// (temperature, top-k, greedy) with the project's seeded Rng, and the generation loop with its
// context-window policy, with or without the KV cache.
//
// Context window: the model has seq_len positions (one wpe row each). The window of tokens the
// next prediction sees starts as the prompt and grows by one token per step. When a new token
// would make it longer than seq_len, it is cut to its last max(1, seq_len / 2) tokens (the new
// one included) and, with the KV cache, the cache is re-primed on them in one batched append().
// Re-priming at half the window costs about one extra (batched) position per generated token and
// keeps at least seq_len / 2 tokens of context; cropping to seq_len - 1 would re-prime on every
// token, as expensive as no cache at all. Both modes use this same window, so for one seed they
// see the same contexts and, up to float rounding, produce the same text.
// Thread safety: functions are pure apart from the decoder and Rng they are given.
#pragma once
#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "model/gpt_decode.h"

namespace ft {

struct SamplingOptions {
  float temperature = 1.0f;  // logits are divided by it; 0 = greedy (argmax, no Rng draw)
  int top_k = 0;             // keep the k largest logits; 0 = the whole vocabulary
};

// The next token from logits [vocab_size]. Greedy picks the lowest index among equal maxima. Else
// softmax(logits / temperature) over the kept tokens (top_k largest, ties broken by lower index),
// computed in double, and one uniform draw from `rng` walked through the cumulative sums in index
// order, so a seed gives the same token on every run and machine for the same logits.
// REQUIRES: temperature finite and >= 0; 0 <= top_k <= vocab_size; vocab_size >= 1 (checked).
int32_t sample_next_token(const float* logits, int vocab_size, const SamplingOptions& options,
                          Rng& rng);

enum class DecodeMode {
  kKvCache,    // one append() of one position per new token (plus the re-primes)
  kRecompute,  // reset() and append() of the whole window for every new token: no cache
};

struct GenerateOptions {
  int max_new_tokens = 200;
  SamplingOptions sampling;
  uint64_t seed = 0;  // seeds the Rng of the draws
  DecodeMode mode = DecodeMode::kKvCache;
};

struct GenerateResult {
  std::vector<int32_t> new_tokens;  // the continuation, without the prompt
  int reprimes = 0;                 // times the window was cut and the cache rebuilt (kKvCache)
  int64_t positions_computed = 0;   // positions run through the model, prompt included
  double seconds = 0.0;             // wall time of the whole loop, prompt prefill included
};

// The window the re-prime keeps (see above).
int reprime_keep(int seq_len);

// Runs the prompt, then draws max_new_tokens tokens. Resets the decoder first.
// REQUIRES: 1 <= prompt.size() <= decoder.capacity(); every token in [0, vocab_size);
// max_new_tokens >= 1; sampling options as sample_next_token requires (checked).
GenerateResult generate(GptDecoder& decoder, const std::vector<int32_t>& prompt,
                        const GenerateOptions& options);

}  // namespace ft

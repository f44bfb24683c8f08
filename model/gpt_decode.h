// GptDecoder: forward-only, eval-mode GPT for autoregressive generation with a per-layer key/value
// cache. append() runs only the new positions through the model: their q, k and v rows are
// computed, k and v are stored in the cache, and every new position attends to all cached
// positions up to itself. One new byte therefore costs one position of work instead of a whole
// window. The math is the graph build_gpt_graph (model/gpt.h) builds in GraphMode::kEval, op for
// op: embedding, pre-LN blocks (q/k/v as row blocks of c_attn, optional per-head qk_norm, causal
// softmax of q k^T / sqrt(head_dim), c_proj, GELU MLP, residuals) and the tied LM head on ln_f;
// tests/gpt_decode_test.cpp checks it against that graph at every position.
// With gemm_dtype kBF16 it is the graph built with gemm_dtype kBF16 (train.precision: bf16): every
// Linear and the LM head round their input rows to bf16 and multiply the parameters' bf16 copies,
// and attention multiplies q, k, v and the softmax weights rounded to bf16, all summing in fp32;
// LayerNorm, softmax, GELU and the residual stream stay fp32 (tests/gpt_decode_bf16_test.cpp).
// The decoder reads the parameters in place (it never copies or owns them) and owns only its
// cache and scratch buffers.
// Thread safety: one thread drives a decoder; the GEMMs inside parallelise through oneDNN.
#pragma once
#include <cstdint>
#include <vector>

#include "model/gpt.h"
#include "model/params.h"

namespace ft {

class GptDecoder {
 public:
  // REQUIRES: `ids` were registered for `shape` in `params` (register_gpt_params), params are
  // allocated, and params outlives the decoder. Dropout is ignored: decoding is eval mode.
  // gemm_dtype kBF16 REQUIRES params.enable_bf16_copies() before allocate, and the copies fresh
  // (refresh_bf16_copies() after the weights change) at every append(); both are checked.
  GptDecoder(const GptShape& shape, const GptParamIds& ids, const ParamStore& params,
             DType gemm_dtype = DType::kF32);
  GptDecoder(const GptDecoder&) = delete;
  GptDecoder& operator=(const GptDecoder&) = delete;

  // Forgets every cached position; the next append() starts at position 0.
  void reset() { cached_positions_ = 0; }

  // Runs tokens[0, count) as positions cached_positions() .. cached_positions() + count - 1 and
  // returns the logits [vocab_size] that predict the token after the last of them. Many tokens at
  // once (a prompt, or a re-primed window) go through the linear layers as one GEMM each.
  // The returned pointer is valid until the next append() or the decoder's destruction.
  // REQUIRES: count >= 1; cached_positions() + count <= capacity(); tokens in [0, vocab_size).
  const float* append(const int32_t* tokens, int count);

  int cached_positions() const { return cached_positions_; }
  // The model's positional limit (shape.seq_len): wpe has one row per position.
  int capacity() const { return shape_.seq_len; }
  int vocab_size() const { return shape_.vocab_size; }
  DType gemm_dtype() const { return gemm_dtype_; }

 private:
  // Causal attention of the `count` new rows of q_ against cache positions [0, own position],
  // written into attended_.
  void attend(int layer, int first_position, int count);
  // y [rows, out] = x [rows, in] W^T (+ bias, when not null) in gemm_dtype_.
  void linear(float* y, const float* x, ParamId weight, const float* bias, int64_t rows,
              int64_t in_features, int64_t out_features);

  GptShape shape_;
  GptParamIds ids_;
  const ParamStore& params_;
  DType gemm_dtype_;
  int cached_positions_ = 0;
  // Per layer, [seq_len, C] each: k (after qk_norm) and v of every cached position, with head h in
  // columns [h * head_dim, (h + 1) * head_dim), as the graph's q/k/v values lay them out.
  std::vector<std::vector<float>> k_cache_, v_cache_;
  // Scratch for up to seq_len new rows.
  std::vector<float> x_;            // residual stream [rows, C]
  std::vector<float> normed_;       // ln_1 / ln_2 output [rows, C]
  std::vector<float> qkv_;          // c_attn output [rows, 3C]: q, k, v column blocks
  std::vector<float> q_;            // q after qk_norm (or a copy of q) [rows, C]
  std::vector<float> attended_;     // attention output before c_proj [rows, C]
  std::vector<float> branch_;       // c_proj / mlp.c_proj output [rows, C]
  std::vector<float> hidden_;       // c_fc output [rows, 4C]
  std::vector<float> activated_;    // GELU output [rows, 4C]
  std::vector<float> probs_;        // one row of attention weights [seq_len]
  std::vector<float> logits_;       // [vocab_size]
  std::vector<bf16_bits> operand_;  // bf16: a GEMM's input rows [rows, at most 4C]
};

}  // namespace ft

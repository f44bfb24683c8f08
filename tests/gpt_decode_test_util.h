// Shared by the GPT decoder tests (tests/gpt_decode_test.cpp, gpt_decode_bf16_test.cpp) and the
// bf16 inference test (tests/inference_bf16_test.cpp): a small GPT whose weights are drawn large
// enough for peaked attention, its full-window eval graph, random tokens and the relative error
// of a row of logits.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "model/executor.h"
#include "model/gpt.h"

namespace ft {
namespace decode_test {

inline GptShape small_shape(bool qk_norm) {
  GptShape shape;
  shape.n_layer = 2;
  shape.n_head = 2;
  shape.d_model = 32;
  shape.seq_len = 16;
  shape.vocab_size = 256;
  shape.qk_norm = qk_norm;
  return shape;
}

// Redraws every value of `params` (allocated) large: weights std 0.25, vectors 0.2, norm weights
// around 1. The init (std 0.02) gives near-uniform attention, under which a wrong scale or a stale
// cache row would barely move the logits, and next-byte predictions that are all near-ties; drawn
// this way attention and predictions are peaked and every term matters.
inline void draw_peaked(ParamStore& params) {
  Rng rng(12);
  for (ParamId id = 0; id < params.size(); ++id) {
    Param& param = params[id];
    const float mean = param.init == ParamInit::kOnes ? 1.0f : 0.0f;
    const float std = param.shape.size() >= 2 ? 0.25f : 0.2f;
    for (int64_t i = 0; i < param.value.numel(); ++i)
      param.value.data()[i] = mean + std * rng.normal();
  }
}

// A peaked random GPT (with fresh bf16 weight copies, so decoders of either precision can read
// it) and its full-window eval graph in `gemm_dtype`.
struct Model {
  explicit Model(bool qk_norm, DType gemm_dtype = DType::kF32) : shape(small_shape(qk_norm)) {
    ids = register_gpt_params(shape, params);
    params.enable_bf16_copies();
    params.allocate();
    draw_peaked(params);
    params.mark_changed();
    params.refresh_bf16_copies();
    graph = build_gpt_graph(shape, 1, ids, GraphMode::kEval, gemm_dtype);
    executor = std::make_unique<Executor>(graph, params);
    ws = executor->make_workspace();
  }

  // Logits [seq_len, V] of the graph over `tokens`, padded with zeros to seq_len (causal
  // attention makes row t independent of the padding after it).
  std::vector<float> full_window_logits(const std::vector<int32_t>& tokens) {
    ws.tokens.assign(shape.seq_len, 0);
    std::copy(tokens.begin(), tokens.end(), ws.tokens.begin());
    ws.targets.assign(shape.seq_len, 0);
    executor->forward(ws);
    const Tensor& logits = ws.values[graph.output];
    return std::vector<float>(logits.data(), logits.data() + logits.numel());
  }

  GptShape shape;
  ParamStore params;
  GptParamIds ids;
  Graph graph;
  std::unique_ptr<Executor> executor;
  Workspace ws;
};

inline std::vector<int32_t> random_tokens(int count, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> tokens(count);
  for (int32_t& token : tokens) token = static_cast<int32_t>(rng.below(256));
  return tokens;
}

// max |a - b| over max |b| for one row of V logits.
inline double relative_error(const float* a, const float* b, int vocab) {
  double diff = 0.0, scale = 0.0;
  for (int i = 0; i < vocab; ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

}  // namespace decode_test
}  // namespace ft

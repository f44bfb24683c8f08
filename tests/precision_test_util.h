// Shared by the whole-model bf16 tests (tests/precision_test.cpp for the GPT,
// tests/resnet_bf16_test.cpp for the ResNet): one training or eval step of a graph after the
// fusion pipeline, what it produced, and how two such results compare.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "fusion/pipeline.h"
#include "model/executor.h"

namespace ft {
namespace precision_test {

struct StepResult {
  float loss = 0;
  std::vector<float> logits, grads;
  int casts = 0;
  std::vector<std::string> kinds;  // of the executed ops
  FusionResult fusion;
};

// Runs the standard fusion pipeline with `options` on `graph`, then one step on fresh
// gradients (poisoned, so a gradient no op writes shows): forward, and backward for a train
// graph. `fill` writes the batch (input, tokens, targets) into the workspace.
inline StepResult run_step(Graph graph, ParamStore& params, const FusionOptions& options,
                           const std::function<void(const Graph&, Workspace&)>& fill) {
  StepResult result;
  result.fusion = FusionPipeline::standard().run(graph, params, options);
  Executor executor(graph, params);
  executor.set_poison_fresh_gradients(true);
  Workspace ws = executor.make_workspace();
  fill(graph, ws);
  params.zero_grads();
  executor.forward(ws);
  if (graph.mode == GraphMode::kTrain) executor.backward(ws);
  result.loss = executor.loss(ws);
  result.logits = ws.values[graph.output].to_host_vector();
  result.grads = params.flat_grads().to_host_vector();
  for (const auto& op : graph.ops) {
    result.casts += op->op_kind() == OpKind::kCast;
    result.kinds.push_back(op->kind());
  }
  return result;
}

// A fusion against its twin: the same loss, logits and gradients, bit for bit.
inline void expect_same_bits(const StepResult& fused, const StepResult& twin, const char* name) {
  EXPECT_EQ(fused.loss, twin.loss) << name;
  EXPECT_EQ(fused.logits, twin.logits) << name;
  EXPECT_EQ(fused.grads, twin.grads) << name;
}

// The largest |expected - actual| as a fraction of the largest |expected|.
inline float relative_error(const std::vector<float>& expected, const std::vector<float>& actual) {
  float largest = 1e-30f, worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    largest = std::max(largest, std::fabs(expected[i]));
    const float error = std::fabs(expected[i] - actual[i]);
    if (!(error <= worst)) worst = error;  // NaN counts as worst
  }
  return worst / largest;
}

inline std::string source_path(const std::string& relative) {
  return std::string(FT_SOURCE_DIR) + "/" + relative;
}

}  // namespace precision_test
}  // namespace ft

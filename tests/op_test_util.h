// Shared scaffolding for the GPT op tests: OpGraph wraps one op with random inputs and
// parameters and a weighted-sum loss; expect_gradients_match runs the finite-difference check.
// The tolerance reasoning is at the top of tests/gpt_ops_test.cpp.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "core/check.h"
#include "core/math/gelu_math.h"
#include "core/rng.h"
#include "fusion/ops/batched_layernorm.h"
#include "model/executor.h"
#include "model/gradcheck.h"
#include "model/ops/attention_mix.h"
#include "model/ops/attention_scores.h"
#include "model/ops/causal_softmax.h"
#include "model/ops/cross_entropy.h"
#include "model/ops/dropout.h"
#include "model/ops/embedding.h"
#include "model/ops/gelu.h"
#include "model/ops/layernorm.h"
#include "model/ops/linear.h"
#include "model/ops/lm_head.h"
#include "model/ops/residual.h"

namespace ft {
namespace op_test {

constexpr float kLinearTolerance = 3e-3f;
constexpr float kSmoothTolerance = 1e-2f;

// A graph holding one op under test, random inputs and parameters, and (unless the op is itself a
// loss) a weighted-sum loss over the op's output.
class OpGraph {
 public:
  ValueId input(const std::string& name, const Shape& shape) {
    const ValueId id = graph.add_value(name, shape);
    inputs.push_back(id);
    return id;
  }
  ValueId value(const std::string& name, const Shape& shape) {
    return graph.add_value(name, shape);
  }
  ParamId param(const std::string& name, const Shape& shape, float mean, float std) {
    const ParamId id = params.add(name, shape, ParamInit::kZeros, 0.0f, true);
    param_fill.push_back({mean, std});
    return id;
  }
  template <typename OpType, typename... Args>
  OpType& op(std::vector<ValueId> ins, std::vector<ValueId> outs, std::vector<ParamId> ps,
             Args&&... args) {
    OpType& added = graph.add_op<OpType>("under_test", std::move(ins), std::move(outs),
                                         std::move(ps), std::forward<Args>(args)...);
    op_under_test = &added;
    return added;
  }
  // Seals the graph: adds the loss over `loss_input` (or uses `loss_value`), allocates and fills.
  void finish(ValueId loss_input, ValueId loss_value = -1) {
    if (loss_value >= 0)
      graph.loss = loss_value;
    else
      add_weighted_sum_loss(graph, loss_input, 99);
    if (bf16_weight_copies) params.enable_bf16_copies();
    params.allocate();
    Rng rng(5);
    for (ParamId id = 0; id < params.size(); ++id) {
      Tensor& values = params[id].value;
      for (int64_t i = 0; i < values.numel(); ++i)
        values.data()[i] = param_fill[id].first + param_fill[id].second * rng.normal();
    }
    if (bf16_weight_copies) params.refresh_bf16_copies();
    executor = std::make_unique<Executor>(graph, params);
    executor->set_poison_fresh_gradients(true);  // an incomplete overwrite shows as NaN
    ws = executor->make_workspace();
    for (ValueId id : inputs)
      for (int64_t i = 0; i < ws.values[id].numel(); ++i) ws.values[id].data()[i] = rng.normal();
  }
  GradcheckReport check(float floor, float eps) {
    GradcheckOptions options;
    options.floor = floor;
    options.eps = eps;
    return gradcheck(graph, params, ws, inputs, options);
  }
  float accumulation_error() {
    params.zero_grads();
    executor->forward(ws);
    executor->backward(ws);
    return backward_accumulation_error(*op_under_test, ws, params);
  }
  void forward() { executor->forward(ws); }
  float* data(ValueId id) { return ws.values[id].data(); }

  ParamStore params;
  Graph graph;
  Workspace ws;
  std::unique_ptr<Executor> executor;
  std::vector<ValueId> inputs;
  std::vector<std::pair<float, float>> param_fill;  // (mean, std) per param
  bool bf16_weight_copies = false;  // set before finish() for ops that read bf16 weights
  Op* op_under_test = nullptr;
};

void expect_gradients_match(OpGraph& g, float tolerance, float floor = 1e-2f, float eps = 1e-2f) {
  const GradcheckReport report = g.check(floor, eps);
  std::printf("  gradcheck: max rel error %.2e over %d entries, worst %s\n", report.max_rel_error,
              report.entries_checked, report.worst.c_str());
  EXPECT_LT(report.max_rel_error, tolerance) << "worst entry " << report.worst;
  EXPECT_GT(report.max_abs_grad, 1e-3f) << "gradients are all ~0: the check would be vacuous";
  EXPECT_GT(report.entries_checked, 0);
  EXPECT_LT(g.accumulation_error(), 1e-5f) << "backward overwrites instead of accumulating";
}

}  // namespace op_test
}  // namespace ft

// Finite-difference gradient checking for graphs of ops with handwritten backward passes.
// gradcheck() runs the executor's forward and backward once for the analytic gradients, then
// perturbs sampled entries of every trainable parameter and of the listed input values and
// compares a five-point finite difference of the loss,
//   numeric = [8 (L(x+h) - L(x-h)) - (L(x+2h) - L(x-2h))] / 12h,
// with the analytic gradient as a relative error |analytic - numeric| / max(|a|, |n|, floor).
// For a single op, wrap it in a graph whose loss is WeightedSumLossOp (sum of output * fixed
// random weights), so every output element carries a distinct gradient.
// Thread safety: drives one graph and workspace on the calling thread.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/graph.h"
#include "model/params.h"

namespace ft {

struct GradcheckOptions {
  // Finite-difference step h. The numeric derivative's error is about
  //   1.5 u |L| / h   (float32 round-off of the loss, u ~ 6e-8, summed over the stencil)
  //   + h^4 |L^(5)| / 30   (truncation of the five-point stencil),
  // so h ~ 1e-2 keeps round-off near 1e-5 |L| and truncation negligible for O(1) curvature.
  float eps = 1e-2f;
  // Denominator floor of the relative error: entries whose true gradient is below the numeric
  // noise (~1.5 u |L| / eps) cannot be checked relatively; the floor compares them absolutely.
  float floor = 1e-3f;
  // Entries per tensor: the one with the largest analytic gradient plus random others
  // (every entry when the tensor is smaller).
  int samples_per_tensor = 12;
  uint64_t seed = 1;
};

struct GradcheckReport {
  float max_rel_error = 0.0f;
  std::string worst;  // "<tensor>[index]: analytic a, numeric n" of the worst entry
  int entries_checked = 0;
  float max_abs_grad = 0.0f;  // largest |analytic| checked: a near-zero value means a vacuous pass
};

// REQUIRES: params allocated and initialised; `ws` made by an Executor over `graph`, with tokens,
// targets and the `input_values` filled in; no op writes any of `input_values`.
// Leaves parameter values and inputs as they were, and the workspace holding a fresh forward.
GradcheckReport gradcheck(Graph& graph, ParamStore& params, Workspace& ws,
                          const std::vector<ValueId>& input_values,
                          const GradcheckOptions& options = {});

// loss[1] = sum_i x[i] * weights[i], weights ~ N(0, 1) fixed at construction. Inputs {x},
// outputs {loss}. The sum is accumulated in double so the loss is rounded once.
class WeightedSumLossOp : public Op {
 public:
  WeightedSumLossOp(int64_t numel, uint64_t seed);
  OpKind op_kind() const override { return OpKind::kOther; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;

 private:
  Tensor weights_;
};

// Appends a WeightedSumLossOp over `value` and makes its output graph.loss.
ValueId add_weighted_sum_loss(Graph& graph, ValueId value, uint64_t seed);

// Checks that op.backward accumulates (+=) rather than overwrites: calls it once more on the
// workspace left by a full backward and returns max |after - 2 before| / max |before| over the
// op's input and parameter gradients (0 when correct, ~0.5-1 when a gradient is overwritten).
// REQUIRES: the executor's backward has just run and nothing has touched the gradients since.
float backward_accumulation_error(Op& op, Workspace& ws, ParamStore& params);

}  // namespace ft

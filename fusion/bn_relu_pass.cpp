// fusion.vertical.bn_relu: a normalisation or a residual add whose only reader is a ReLU becomes
// one op that applies the ReLU in its own elementwise pass (forward and backward):
//   BatchNorm2dOp        -> ReluOp  =>  BatchNormReluOp           (train graphs)
//   BatchNormInferenceOp -> ReluOp  =>  BatchNormInferenceReluOp  (eval graphs)
//   ResidualAddOp        -> ReluOp  =>  AddReluOp
// In train graphs the add also absorbs the BatchNorms whose only reader it is (a block's bn2 and
// a downsampling block's shortcut BN), as many as max_ops allows beyond the add and the ReLU:
//   BatchNorm2dOp [+ BatchNorm2dOp] -> ResidualAddOp -> ReluOp  =>  BatchNormAddReluOp
// (3 or 4 eager ops; with max_ops 2 the add and ReLU alone). The unfused twins are the chains
// themselves; tests/fusion_resnet_test.cpp and fusion_bn_add_relu_test.cpp check they agree.
// Every BatchNorm and residual add is a candidate; those not followed by a sole ReLU are skipped
// with the reason, and a BatchNorm that feeds such an add is decided with it.
// Thread safety: stateless.
#include <memory>
#include <string>
#include <vector>

#include "fusion/ops/add_relu.h"
#include "fusion/ops/batchnorm_add_relu.h"
#include "fusion/ops/batchnorm_relu.h"
#include "fusion/pass_util.h"
#include "fusion/passes.h"
#include "model/graph_edit.h"
#include "model/ops/batchnorm.h"
#include "model/ops/batchnorm_inference.h"

namespace ft {
namespace {

constexpr const char* kPass = "bn_relu";
constexpr int kPairOps = 2;

bool is_candidate(OpKind kind) {
  return kind == OpKind::kBatchNorm || kind == OpKind::kBatchNormInference ||
         kind == OpKind::kResidualAdd;
}

// The ReLU that is the only reader of `id`, or -1 with the reason in `why`.
int sole_relu(const Graph& graph, const GraphIndex& index, ValueId id, std::string* why) {
  const int consumer =
      sole_reader(index, id, "output '" + graph.values[id].name + "'", "output", why);
  if (consumer < 0) return -1;
  const Op& relu = *graph.ops[consumer];
  if (relu.op_kind() != OpKind::kRelu) {
    *why = "output feeds a " + std::string(relu.kind()) + ", not a relu";
    return -1;
  }
  return consumer;
}

// The fused op standing for `op` followed by a ReLU, and what `plan` calls the rewrite.
std::unique_ptr<Op> fused_with_relu(const Graph& graph, const Op& op, std::string* what) {
  switch (op.op_kind()) {
    case OpKind::kBatchNorm: {
      const auto& bn = static_cast<const BatchNorm2dOp&>(op);
      *what = "batchnorm2d+relu -> batchnorm_relu";
      return std::make_unique<BatchNormReluOp>(bn.batch(), bn.channels(), bn.height(), bn.width(),
                                               bn.momentum(), bn.eps());
    }
    case OpKind::kBatchNormInference: {
      const auto& bn = static_cast<const BatchNormInferenceOp&>(op);
      *what = "batchnorm2d_inference+relu -> batchnorm_inference_relu";
      return std::make_unique<BatchNormInferenceReluOp>(bn.batch(), bn.channels(), bn.height(),
                                                        bn.width(), bn.eps());
    }
    default:
      *what = "residual+relu -> add_relu";
      return std::make_unique<AddReluOp>(graph.numel(op.outputs[0]));
  }
}

// True when `op` is a train-graph BatchNorm whose only reader is a residual add whose only reader
// is a ReLU: the add's turn decides whether it is absorbed.
bool feeds_residual_relu(const Graph& graph, const GraphIndex& index, const Op& op) {
  if (op.op_kind() != OpKind::kBatchNorm) return false;
  std::string why;
  const int add = sole_reader(index, op.outputs[0], "", "", &why);
  if (add < 0 || graph.ops[add]->op_kind() != OpKind::kResidualAdd) return false;
  return sole_relu(graph, index, graph.ops[add]->outputs[0], &why) >= 0;
}

// The train-graph BatchNorms among the summands of the add at `add_index` that only the add
// reads, in input order, as many as max_ops leaves room for; those beyond it are skipped.
std::vector<int> absorbable_batchnorms(const Graph& graph, const GraphIndex& index, int add_index,
                                       PassContext& context) {
  std::vector<int> absorbed;
  for (ValueId summand : graph.ops[add_index]->inputs) {
    const int producer = index.producer(summand);
    if (producer < 0 || !feeds_residual_relu(graph, index, *graph.ops[producer])) continue;
    const int chain_ops = kPairOps + static_cast<int>(absorbed.size()) + 1;
    if (within_max_ops(context, kPass, graph.ops[producer]->name, chain_ops))
      absorbed.push_back(producer);
  }
  return absorbed;
}

// BatchNormAddReluOp for the add at `add_index` and the BatchNorms `absorbed` (main first).
std::unique_ptr<Op> batchnorm_add_relu(const Graph& graph, int add_index,
                                       const std::vector<int>& absorbed) {
  const auto& main = static_cast<const BatchNorm2dOp&>(*graph.ops[absorbed[0]]);
  const Op& add = *graph.ops[add_index];
  BatchNormSettings shortcut_settings;
  const bool normalised = absorbed.size() == 2;
  if (normalised) {
    const auto& shortcut = static_cast<const BatchNorm2dOp&>(*graph.ops[absorbed[1]]);
    shortcut_settings = {shortcut.momentum(), shortcut.eps()};
  }
  auto fused = std::make_unique<BatchNormAddReluOp>(
      main.batch(), main.channels(), main.height(), main.width(),
      BatchNormSettings{main.momentum(), main.eps()}, normalised ? &shortcut_settings : nullptr);
  fused->inputs = graph.ops[absorbed[0]]->inputs;
  fused->params = graph.ops[absorbed[0]]->params;
  const ValueId main_output = graph.ops[absorbed[0]]->outputs[0];
  if (normalised) {
    const Op& shortcut = *graph.ops[absorbed[1]];
    fused->inputs.push_back(shortcut.inputs[0]);
    fused->params.insert(fused->params.end(), shortcut.params.begin(), shortcut.params.end());
  } else {
    // The summand that is not the main BatchNorm's output.
    fused->inputs.push_back(add.inputs[0] == main_output ? add.inputs[1] : add.inputs[0]);
  }
  return fused;
}

class BnReluPass : public FusionPass {
 public:
  const char* name() const override { return kPass; }
  bool enabled(const FusionOptions& options) const override { return options.vertical.bn_relu; }

  int apply(Graph& graph, PassContext& context) const override {
    int fused = 0;
    for (int op_index = 0; op_index < static_cast<int>(graph.ops.size()); ++op_index) {
      const Op& op = *graph.ops[op_index];
      if (!is_candidate(op.op_kind())) continue;
      const std::string site = op.name;
      const GraphIndex index(graph);
      if (feeds_residual_relu(graph, index, op)) continue;  // decided at the add
      std::string why;
      const int relu_index = sole_relu(graph, index, op.outputs[0], &why);
      if (relu_index < 0) {
        context.skipped(kPass, site, why);
        continue;
      }
      const bool pair_fits = within_max_ops(context, kPass, site, kPairOps);
      // Also when the pair does not fit, so that each BatchNorm before the add has its decision.
      const std::vector<int> absorbed = op.op_kind() == OpKind::kResidualAdd
                                            ? absorbable_batchnorms(graph, index, op_index, context)
                                            : std::vector<int>{};
      if (!pair_fits) continue;
      std::string what;
      std::unique_ptr<Op> replacement;
      std::vector<int> removed = {op_index, relu_index};
      if (absorbed.empty()) {
        replacement = fused_with_relu(graph, op, &what);
        replacement->inputs = op.inputs;
        replacement->params = op.params;
      } else {
        replacement = batchnorm_add_relu(graph, op_index, absorbed);
        what = absorbed.size() == 2 ? "batchnorm2d x2+residual+relu -> batchnorm_add_relu"
                                    : "batchnorm2d+residual+relu -> batchnorm_add_relu";
        removed.insert(removed.end(), absorbed.begin(), absorbed.end());
      }
      const int eager_ops = static_cast<int>(removed.size());
      replacement->name = site + "_relu";
      replacement->outputs = graph.ops[relu_index]->outputs;
      replacement->eager_ops = eager_ops;
      // Placed where the ReLU was; only the ReLU read the intermediate, which is now dead. The
      // absorbed BatchNorms came before the add, so the op after the add moves up by them.
      replace_op_set(graph, removed, std::move(replacement));
      context.fused(kPass, site, what, eager_ops);
      ++fused;
      op_index -= 1 + static_cast<int>(absorbed.size());
    }
    return fused;
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_bn_relu_pass() {
  return std::make_unique<BnReluPass>();
}

}  // namespace ft

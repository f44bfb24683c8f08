// fusion.vertical.bn_relu: a normalisation or a residual add whose only reader is a ReLU becomes
// one op that applies the ReLU in its own elementwise pass (forward and backward):
//   BatchNorm2dOp        -> ReluOp  =>  BatchNormReluOp           (train graphs)
//   BatchNormInferenceOp -> ReluOp  =>  BatchNormInferenceReluOp  (eval graphs)
//   ResidualAddOp        -> ReluOp  =>  AddReluOp
// The unfused twins are the pairs themselves; tests/fusion_resnet_test.cpp checks they agree.
// Every BatchNorm and residual add is a candidate; those not followed by a sole ReLU (bn2 and the
// shortcut's BN feed the add) are skipped with the reason.
// Thread safety: stateless.
#include <memory>
#include <string>

#include "fusion/ops/add_relu.h"
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
      std::string why;
      const int relu_index = sole_relu(graph, index, op.outputs[0], &why);
      if (relu_index < 0) {
        context.skipped(kPass, site, why);
        continue;
      }
      if (!within_max_ops(context, kPass, site, kPairOps)) continue;
      std::string what;
      std::unique_ptr<Op> replacement = fused_with_relu(graph, op, &what);
      replacement->name = site + "_relu";
      replacement->inputs = op.inputs;
      replacement->outputs = graph.ops[relu_index]->outputs;
      replacement->params = op.params;
      replacement->eager_ops = kPairOps;
      // Placed where the ReLU was; only the ReLU read the intermediate, which is now dead.
      replace_op_set(graph, {op_index, relu_index}, std::move(replacement));
      context.fused(kPass, site, what, kPairOps);
      ++fused;
      --op_index;  // the op now at op_index followed the removed one
    }
    return fused;
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_bn_relu_pass() {
  return std::make_unique<BnReluPass>();
}

}  // namespace ft

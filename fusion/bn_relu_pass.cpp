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
// Order: after fold_bn (PassInfo::after), which takes eval graphs' conv -> BN -> ReLU chains
// whole; before cast, which makes BatchNormRelu and BatchNormAddRelu write bf16.
// Thread safety: stateless.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fusion/ops/add_relu.h"
#include "fusion/ops/batchnorm_add_relu.h"
#include "fusion/ops/batchnorm_relu.h"
#include "fusion/pass_util.h"
#include "fusion/passes.h"
#include "fusion/rewrite.h"
#include "model/graph_edit.h"
#include "model/ops/batchnorm.h"
#include "model/ops/batchnorm_inference.h"

namespace ft {
namespace {

const char* const kPass = bn_relu_info().name;
constexpr int kPairOps = 2;

bool is_candidate_kind(OpKind kind) {
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

// BatchNormAddReluOp for the add at `add_index` and the BatchNorms `absorbed` (main first), with
// its inputs and params in `fusion`.
void batchnorm_add_relu(const Graph& graph, int add_index, const std::vector<int>& absorbed,
                        Fusion* fusion) {
  const auto& main = static_cast<const BatchNorm2dOp&>(*graph.ops[absorbed[0]]);
  const Op& add = *graph.ops[add_index];
  BatchNormSettings shortcut_settings;
  const bool normalised = absorbed.size() == 2;
  if (normalised) {
    const auto& shortcut = static_cast<const BatchNorm2dOp&>(*graph.ops[absorbed[1]]);
    shortcut_settings = {shortcut.momentum(), shortcut.eps()};
  }
  fusion->op = std::make_unique<BatchNormAddReluOp>(
      main.batch(), main.channels(), main.height(), main.width(),
      BatchNormSettings{main.momentum(), main.eps()}, normalised ? &shortcut_settings : nullptr);
  fusion->inputs = main.inputs;
  fusion->params = main.params;
  if (normalised) {
    const Op& shortcut = *graph.ops[absorbed[1]];
    fusion->inputs.push_back(shortcut.inputs[0]);
    fusion->params.insert(fusion->params.end(), shortcut.params.begin(), shortcut.params.end());
  } else {
    // The summand that is not the main BatchNorm's output.
    const ValueId main_output = main.outputs[0];
    fusion->inputs.push_back(add.inputs[0] == main_output ? add.inputs[1] : add.inputs[0]);
  }
}

class BnReluPass : public CandidatePass {
 public:
  const PassInfo& info() const override { return bn_relu_info(); }

 protected:
  bool is_candidate(const Op& op) const override { return is_candidate_kind(op.op_kind()); }

  std::optional<Fusion> decide(const Graph& graph, const GraphIndex& index, int op_index,
                               PassContext& context) const override {
    const Op& op = *graph.ops[op_index];
    const std::string site = op.name;
    if (feeds_residual_relu(graph, index, op)) return std::nullopt;  // decided at the add
    std::string why;
    const int relu_index = sole_relu(graph, index, op.outputs[0], &why);
    if (relu_index < 0) {
      context.skipped(kPass, site, why);
      return std::nullopt;
    }
    const bool pair_fits = within_max_ops(context, kPass, site, kPairOps);
    // Also when the pair does not fit, so that each BatchNorm before the add has its decision.
    const std::vector<int> absorbed = op.op_kind() == OpKind::kResidualAdd
                                          ? absorbable_batchnorms(graph, index, op_index, context)
                                          : std::vector<int>{};
    if (!pair_fits) return std::nullopt;
    Fusion fusion;
    // Placed where the ReLU was; only the ReLU read the intermediate, which is now dead.
    fusion.absorbed = {op_index, relu_index};
    if (absorbed.empty()) {
      fusion.op = fused_with_relu(graph, op, &fusion.what);
      fusion.inputs = op.inputs;
      fusion.params = op.params;
    } else {
      batchnorm_add_relu(graph, op_index, absorbed, &fusion);
      fusion.what = absorbed.size() == 2 ? "batchnorm2d x2+residual+relu -> batchnorm_add_relu"
                                         : "batchnorm2d+residual+relu -> batchnorm_add_relu";
      fusion.absorbed.insert(fusion.absorbed.end(), absorbed.begin(), absorbed.end());
    }
    fusion.name = site + "_relu";
    fusion.outputs = graph.ops[relu_index]->outputs;
    fusion.site = site;
    return fusion;
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_bn_relu_pass() {
  return std::make_unique<BnReluPass>();
}

}  // namespace ft

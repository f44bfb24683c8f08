// inference.fold_bn: in an eval graph, a convolution whose only reader is a BatchNorm with running
// statistics becomes one ConvBiasOp (fusion/ops/conv_bias.h) with the BN folded into its weights,
// taking with it what follows while the chain stays single-reader:
//   Conv2d -> BatchNormInference                         => conv_bias          (downsample 1x1)
//   Conv2d -> BatchNormInference -> ReLU                 => conv_bias + relu   (stem, conv1)
//   Conv2d -> BatchNormInference -> ResidualAdd (-> ReLU) => conv_bias + residual (+ relu) (conv2)
// The residual add's other summand (the block input, or the downsample branch) becomes the op's
// second input; the op sits where the last absorbed op was, after that summand is written.
// Train graphs are refused: their BN normalises with batch statistics, which no weight can hold.
// A convolution whose output has another reader is skipped with the reason (folding would change
// what that reader sees). fusion.max_ops shortens the chain (2 ops: conv and BN alone).
// Order: first; bn_relu (which would otherwise take BN -> ReLU) and conv_shortcut declare
// PassInfo::after fold_bn, so they see only what folding left.
// Thread safety: stateless.
#include <memory>
#include <optional>
#include <string>

#include "fusion/ops/conv_bias.h"
#include "fusion/pass_util.h"
#include "fusion/passes.h"
#include "fusion/rewrite.h"
#include "model/graph_edit.h"
#include "model/ops/batchnorm_inference.h"
#include "model/ops/conv2d.h"

namespace ft {
namespace {

const char* const kPass = fold_bn_info().name;

// What one candidate chain absorbs, and the ops it replaces.
struct FoldChain {
  std::vector<int> ops;  // conv, bn, [add], [relu]
  ValueId output = -1;
  ValueId residual = -1;
  bool relu = false;
};

// The op reading `id` alone, or -1 (reasons are recorded only for the conv's output, the one
// that decides whether folding is possible at all).
int only_reader(const GraphIndex& index, ValueId id) {
  std::string unused;
  return sole_reader(index, id, "", "", &unused);
}

// Extends the conv + BN chain by the ReLU, or the residual add and the ReLU after it, that read
// its output alone, within `max_ops`.
void extend_chain(const Graph& graph, const GraphIndex& index, int max_ops, FoldChain* chain) {
  const int next = only_reader(index, chain->output);
  if (next < 0 || static_cast<int>(chain->ops.size()) >= max_ops) return;
  const Op& op = *graph.ops[next];
  if (op.op_kind() == OpKind::kRelu) {
    chain->ops.push_back(next);
    chain->output = op.outputs[0];
    chain->relu = true;
    return;
  }
  if (op.op_kind() != OpKind::kResidualAdd) return;
  chain->ops.push_back(next);
  chain->residual = op.inputs[0] == chain->output ? op.inputs[1] : op.inputs[0];
  chain->output = op.outputs[0];
  const int relu = only_reader(index, chain->output);
  if (relu >= 0 && graph.ops[relu]->op_kind() == OpKind::kRelu &&
      static_cast<int>(chain->ops.size()) < max_ops) {
    chain->ops.push_back(relu);
    chain->output = graph.ops[relu]->outputs[0];
    chain->relu = true;
  }
}

std::string describe(const FoldChain& chain) {
  std::string what = "conv2d+batchnorm2d_inference";
  if (chain.residual >= 0) what += "+residual";
  if (chain.relu) what += "+relu";
  return what + " -> conv_bias";
}

class FoldBnPass : public CandidatePass {
 public:
  const PassInfo& info() const override { return fold_bn_info(); }

  int apply(Graph& graph, PassContext& context) const override {
    if (graph.mode == GraphMode::kTrain) {
      context.skipped(kPass, "graph",
                      "train graph: its BatchNorm normalises with batch statistics, which "
                      "cannot be folded into weights (eval graphs only)");
      return 0;
    }
    return CandidatePass::apply(graph, context);
  }

 protected:
  bool is_candidate(const Op& op) const override { return op.op_kind() == OpKind::kConv2d; }

  std::optional<Fusion> decide(const Graph& graph, const GraphIndex& index, int op_index,
                               PassContext& context) const override {
    const auto& conv = static_cast<const Conv2dOp&>(*graph.ops[op_index]);
    const std::string site = conv.name;
    std::string why;
    const int bn_index = sole_reader(index, conv.outputs[0],
                                     "conv output '" + graph.values[conv.outputs[0]].name + "'",
                                     "conv output", &why);
    if (bn_index < 0) {
      context.skipped(kPass, site, why + ": the BatchNorm cannot be folded into it");
      return std::nullopt;
    }
    const Op& bn_op = *graph.ops[bn_index];
    if (bn_op.op_kind() != OpKind::kBatchNormInference) {
      context.skipped(
          kPass, site,
          std::string("conv feeds a ") + bn_op.kind() + ", not a batchnorm2d_inference");
      return std::nullopt;
    }
    if (!within_max_ops(context, kPass, site, 2)) return std::nullopt;
    const auto& bn = static_cast<const BatchNormInferenceOp&>(bn_op);
    FoldChain chain;
    chain.ops = {op_index, bn_index};
    chain.output = bn.outputs[0];
    extend_chain(graph, index, context.options.max_ops, &chain);

    ConvBiasSpec spec = conv_bias_spec(conv);
    spec.residual = chain.residual >= 0;
    spec.relu = chain.relu;
    spec.bn_affine = true;
    spec.eps = bn.eps();
    Fusion fusion;
    fusion.absorbed = chain.ops;
    fusion.op = std::make_unique<ConvBiasOp>(spec, ConvBiasSource::kBatchNorm);
    fusion.name = site + "_bn";
    fusion.inputs = {conv.inputs[0]};
    if (spec.residual) fusion.inputs.push_back(chain.residual);
    fusion.outputs = {chain.output};
    fusion.params = {conv.params[0]};
    fusion.params.insert(fusion.params.end(), bn.params.begin(), bn.params.end());
    fusion.site = site;
    fusion.what = describe(chain);
    return fusion;
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_fold_bn_pass() {
  return std::make_unique<FoldBnPass>();
}

}  // namespace ft

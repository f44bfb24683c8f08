// fusion.vertical.classifier: TiedLmHeadOp -> SoftmaxCrossEntropyOp (two eager ops, with the
// probabilities and the logits' gradient as two more [rows, V] tensors) becomes one ClassifierOp
// (fusion/ops/classifier.h) that writes logits, loss and, in training, dlogits row block by row
// block. The unfused twin is the pair itself; tests/fusion_classifier_test.cpp checks the two
// agree. A candidate is every cross-entropy; only one fed by the tied LM head is fused (the
// ResNet's fc -> loss is left alone, with its reason).
// Order: none (PassInfo::after is empty).
// Thread safety: stateless.
#include <algorithm>
#include <optional>
#include <string>

#include "fusion/ops/classifier.h"
#include "fusion/pass_util.h"
#include "fusion/passes.h"
#include "fusion/rewrite.h"
#include "model/graph_edit.h"

namespace ft {
namespace {

const char* const kPass = classifier_info().name;
constexpr int kChainOps = 2;

// The LM head feeding the cross-entropy at `loss_index`, or the reason it cannot be fused.
struct ClassifierMatch {
  int lm_head = -1;     // op index
  std::string refusal;  // empty when fusable
};

ClassifierMatch match_classifier(const Graph& graph, const GraphIndex& index, int loss_index) {
  ClassifierMatch match;
  const Op& loss_op = *graph.ops[loss_index];
  const ValueId logits = loss_op.inputs[0];
  const int producer = index.producer(logits);
  if (producer < 0) {
    match.refusal = "logits '" + graph.values[logits].name + "' have no producing op";
    return match;
  }
  const Op& head = *graph.ops[producer];
  if (head.op_kind() != OpKind::kLmHead) {
    match.refusal = "logits come from " + std::string(head.kind()) + " '" + head.name +
                    "'; only the tied LM head is fused";
    return match;
  }
  // The fused op's backward knows only d loss: any other reader's gradient would be lost.
  const int readers = index.reader_count_with_views(logits);
  if (readers != 1) {
    match.refusal = "logits have " + std::to_string(readers) + " consumers";
    return match;
  }
  if (graph.values[logits].is_view()) {
    match.refusal = "logits '" + graph.values[logits].name + "' are a column view";
    return match;
  }
  match.lm_head = producer;
  return match;
}

// "lm_head" -> "lm_head.classifier".
std::string fused_name(const std::string& head_name) {
  return head_name + ".classifier";
}

class ClassifierPass : public CandidatePass {
 public:
  const PassInfo& info() const override { return classifier_info(); }

 protected:
  bool is_candidate(const Op& op) const override { return op.op_kind() == OpKind::kCrossEntropy; }

  std::optional<Fusion> decide(const Graph& graph, const GraphIndex& index, int op_index,
                               PassContext& context) const override {
    const ClassifierMatch match = match_classifier(graph, index, op_index);
    const std::string site =
        match.lm_head >= 0 ? graph.ops[match.lm_head]->name : graph.ops[op_index]->name;
    if (!match.refusal.empty()) {
      context.skipped(kPass, site, match.refusal);
      return std::nullopt;
    }
    if (!within_max_ops(context, kPass, site, kChainOps)) return std::nullopt;
    const Op& head = *graph.ops[match.lm_head];
    const Op& loss_op = *graph.ops[op_index];
    const ValueId logits = loss_op.inputs[0];
    const int64_t vocab = graph.shape(logits).back();
    const int64_t rows = graph.numel(logits) / vocab;
    const int64_t channels = graph.numel(head.inputs[0]) / rows;
    const int64_t tile = rows_per_tile(context.options.tile_kb, vocab);
    if (tile < 1) {
      context.skipped(kPass, site, row_exceeds_tile(context.options.tile_kb, vocab));
      return std::nullopt;
    }
    const int tile_rows = static_cast<int>(std::min(tile, rows));
    const bool training = graph.mode == GraphMode::kTrain;
    Fusion fusion = fusion_like(head);
    fusion.absorbed = {match.lm_head, op_index};
    fusion.op = std::make_unique<ClassifierOp>(
        rows, channels, vocab, tile_rows,
        training ? ClassifierForward::kLossAndDlogits : ClassifierForward::kLossOnly);
    fusion.name = fused_name(head.name);
    fusion.outputs = {logits, loss_op.outputs[0]};
    // No op reads the logits' gradient any more: it gets no buffer and no per-step zeroing.
    fusion.no_grad = {logits};
    fusion.site = site;
    fusion.what = "lm_head+cross_entropy -> classifier (block " + std::to_string(tile_rows) +
                  " rows" + (training ? ", dlogits in forward)" : ", loss only)");
    return fusion;
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_classifier_pass() {
  return std::make_unique<ClassifierPass>();
}

}  // namespace ft

// fusion.vertical.cast (train.precision: bf16): a CastOp whose fp32 input has no other reader is
// absorbed by the op producing that input, which then writes bf16 itself: the fp32 tensor's
// write and the cast's read of it disappear, and so does the fp32 buffer. The unfused twin is the
// producer followed by the cast; tests/precision_test.cpp checks each pair agrees bit for bit.
//   LayerNorm -> cast               => LayerNormCastOp (fusion/ops/layernorm_cast.h)
//   GELU -> cast                    => GeluCastOp (same file)
//   ResidualLayerNorm's normed -> cast, LinearGelu -> cast
//                                   => the fused op writes that output in bf16
//   ReLU -> cast                    => ReluCastOp (fusion/ops/relu_cast.h)
//   BatchNormRelu -> cast, BatchNormAddRelu -> cast (a ResNet's ReLU feeding convolutions)
//                                   => the fused op writes its output in bf16
// Order: runs after every other vertical pass, so it sees their fused producers (it needs
// residual_layernorm and gemm_epilogue done first); nothing runs after it that matches casts.
// Producers not listed (attention, the embedding, the ResNet's pooling) keep their cast, with the
// reason in `plan`; so does a ResNet block output that an identity shortcut also reads.
// Thread safety: stateless.
#include <memory>
#include <string>

#include "fusion/ops/layernorm_cast.h"
#include "fusion/ops/linear_gelu.h"
#include "fusion/ops/relu_cast.h"
#include "fusion/pass_util.h"
#include "fusion/passes.h"
#include "model/graph_edit.h"
#include "model/ops/layernorm.h"
#include "model/ops/relu.h"

namespace ft {
namespace {

constexpr const char* kPass = "cast";

std::string kib(double bytes) {
  return std::to_string(static_cast<int64_t>(bytes / 1024.0 + 0.5)) + " KiB";
}

// The op to put at `producer_index` so that it writes `bf16_value` in place of its fp32 output
// `fp32_value`; null with `refusal` set when the producer cannot.
std::unique_ptr<Op> bf16_writer(Graph& graph, int producer_index, ValueId fp32_value,
                                ValueId bf16_value, std::string* refusal) {
  Op& producer = *graph.ops[producer_index];
  auto rewired = [&](std::unique_ptr<Op> op) {
    op->name = producer.name;
    op->inputs = producer.inputs;
    op->outputs = producer.outputs;
    for (ValueId& id : op->outputs)
      if (id == fp32_value) id = bf16_value;
    op->params = producer.params;
    op->eager_ops = producer.eager_ops + 1;
    return op;
  };
  switch (producer.op_kind()) {
    case OpKind::kLayerNorm: {
      const auto& norm = static_cast<const LayerNormOp&>(producer);
      return rewired(std::make_unique<LayerNormCastOp>(norm.rows(), norm.channels()));
    }
    case OpKind::kGelu:
      return rewired(std::make_unique<GeluCastOp>(graph.numel(fp32_value)));
    case OpKind::kRelu:
      return rewired(std::make_unique<ReluCastOp>(static_cast<const ReluOp&>(producer).numel()));
    case OpKind::kBatchNormRelu:
    case OpKind::kBatchNormAddRelu:
      break;
    case OpKind::kResidualLayerNorm:
      if (producer.outputs[1] != fp32_value) {
        *refusal = "the residual stream of '" + producer.name + "' is not a GEMM operand";
        return nullptr;
      }
      break;
    case OpKind::kLinearGelu:
      if (static_cast<const LinearGeluOp&>(producer).forward_kind() !=
          LinearGeluForward::kTiledKeepPreactivation) {
        *refusal = "'" + producer.name + "' runs oneDNN's GELU post-op, which writes fp32";
        return nullptr;
      }
      break;
    default:
      *refusal = std::string(producer.kind()) + " '" + producer.name + "' writes fp32 only";
      return nullptr;
  }
  // The fused ops that take a bf16 output themselves: the same op, rewired.
  for (ValueId& id : producer.outputs)
    if (id == fp32_value) id = bf16_value;
  producer.eager_ops += 1;
  return nullptr;
}

bool written_through_views(const Graph& graph, ValueId root) {
  for (const auto& op : graph.ops)
    for (ValueId id : op->outputs)
      if (graph.values[id].view_of == root) return true;
  return false;
}

class CastPass : public FusionPass {
 public:
  const char* name() const override { return kPass; }
  bool enabled(const FusionOptions& options) const override { return options.vertical.cast; }

  int apply(Graph& graph, PassContext& context) const override {
    int fused = 0;
    for (int op_index = 0; op_index < static_cast<int>(graph.ops.size()); ++op_index) {
      if (graph.ops[op_index]->op_kind() != OpKind::kCast) continue;
      const GraphIndex index(graph);
      const Op& cast = *graph.ops[op_index];
      const std::string site = cast.name;
      const ValueId fp32_value = cast.inputs[0], bf16_value = cast.outputs[0];
      const int producer = index.producer(fp32_value);
      const int readers = index.reader_count_with_views(fp32_value);
      std::string refusal;
      // Views first: a view's producer writes its root (a batched or QKV output), not the view.
      if (graph.values[fp32_value].is_view() || graph.values[bf16_value].is_view())
        refusal = "a column view on either side";
      else if (producer < 0)
        refusal = "'" + graph.values[fp32_value].name + "' has no producing op" +
                  (written_through_views(graph, fp32_value)
                       ? " of its own: ops write it through column views (per-head LayerNorms)"
                       : "");
      else if (index.is_graph_result(fp32_value))
        refusal = "'" + graph.values[fp32_value].name + "' is a graph result";
      else if (readers != 1)
        refusal = "'" + graph.values[fp32_value].name + "' has " + std::to_string(readers) +
                  " readers: its fp32 form is needed";
      if (refusal.empty() &&
          !within_max_ops(context, kPass, site, graph.ops[producer]->eager_ops + 1))
        continue;
      const std::string producer_kind = refusal.empty() ? graph.ops[producer]->kind() : "";
      std::unique_ptr<Op> replacement;
      if (refusal.empty())
        replacement = bf16_writer(graph, producer, fp32_value, bf16_value, &refusal);
      if (!refusal.empty()) {
        context.skipped(kPass, site, refusal);
        continue;
      }
      const double saved = 2 * 4.0 * static_cast<double>(graph.numel(fp32_value));
      if (replacement) {
        graph.ops[producer] = std::move(replacement);
      }
      const int eager_ops = graph.ops[producer]->eager_ops;
      graph.ops.erase(graph.ops.begin() + op_index);
      context.fused(kPass, site,
                    producer_kind + "+cast -> " + graph.ops[producer]->kind() +
                        " writes bf16 (fp32 write and read of " + kib(saved / 2) + " each saved)",
                    eager_ops);
      ++fused;
      --op_index;
    }
    return fused;
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_cast_pass() {
  return std::make_unique<CastPass>();
}

}  // namespace ft

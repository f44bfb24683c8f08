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
// Order: after gemm_epilogue, residual_layernorm and bn_relu, whose fused producers it rewrites,
// and after attention, which absorbs the probabilities' cast itself (PassInfo::after); nothing
// runs after it that matches casts.
// Producers not listed (attention, the embedding, the ResNet's pooling) keep their cast, with the
// reason in `plan`; so does a ResNet block output that an identity shortcut also reads.
// Thread safety: stateless.
#include <memory>
#include <optional>
#include <string>

#include "fusion/ops/layernorm_cast.h"
#include "fusion/ops/linear_gelu.h"
#include "fusion/ops/relu_cast.h"
#include "fusion/pass_util.h"
#include "fusion/passes.h"
#include "fusion/rewrite.h"
#include "model/graph_edit.h"
#include "model/ops/layernorm.h"
#include "model/ops/relu.h"

namespace ft {
namespace {

const char* const kPass = cast_info().name;

std::string kib(double bytes) {
  return std::to_string(static_cast<int64_t>(bytes / 1024.0 + 0.5)) + " KiB";
}

// The rewrite that makes the producer at `producer_index` write `bf16_value` in place of its fp32
// output `fp32_value`: a bf16-writing op of its own (LayerNorm, GELU, ReLU), or the fused producer
// itself, rewired (those that take a bf16 output themselves). False with `refusal` set when the
// producer cannot write bf16.
bool bf16_writer(const Graph& graph, int producer_index, ValueId fp32_value, ValueId bf16_value,
                 Fusion* fusion, std::string* refusal) {
  const Op& producer = *graph.ops[producer_index];
  switch (producer.op_kind()) {
    case OpKind::kLayerNorm: {
      const auto& norm = static_cast<const LayerNormOp&>(producer);
      fusion->op = std::make_unique<LayerNormCastOp>(norm.rows(), norm.channels());
      break;
    }
    case OpKind::kGelu:
      fusion->op = std::make_unique<GeluCastOp>(graph.numel(fp32_value));
      break;
    case OpKind::kRelu:
      fusion->op = std::make_unique<ReluCastOp>(static_cast<const ReluOp&>(producer).numel());
      break;
    case OpKind::kBatchNormRelu:
    case OpKind::kBatchNormAddRelu:
      break;
    case OpKind::kResidualLayerNorm:
      if (producer.outputs[1] != fp32_value) {
        *refusal = "the residual stream of '" + producer.name + "' is not a GEMM operand";
        return false;
      }
      break;
    case OpKind::kLinearGelu:
      if (static_cast<const LinearGeluOp&>(producer).forward_kind() !=
          LinearGeluForward::kTiledKeepPreactivation) {
        *refusal = "'" + producer.name + "' runs oneDNN's GELU post-op, which writes fp32";
        return false;
      }
      break;
    default:
      *refusal = std::string(producer.kind()) + " '" + producer.name + "' writes fp32 only";
      return false;
  }
  // The op (new, or the producer itself when fusion->op is null) sits where the producer was.
  fusion->placement = Placement::kFirst;
  fusion->name = producer.name;
  fusion->inputs = producer.inputs;
  fusion->outputs = producer.outputs;
  for (ValueId& id : fusion->outputs)
    if (id == fp32_value) id = bf16_value;
  fusion->params = producer.params;
  return true;
}

bool written_through_views(const Graph& graph, ValueId root) {
  for (const auto& op : graph.ops)
    for (ValueId id : op->outputs)
      if (graph.values[id].view_of == root) return true;
  return false;
}

class CastPass : public CandidatePass {
 public:
  const PassInfo& info() const override { return cast_info(); }

 protected:
  bool is_candidate(const Op& op) const override { return op.op_kind() == OpKind::kCast; }

  std::optional<Fusion> decide(const Graph& graph, const GraphIndex& index, int op_index,
                               PassContext& context) const override {
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
      return std::nullopt;
    Fusion fusion;
    if (refusal.empty()) bf16_writer(graph, producer, fp32_value, bf16_value, &fusion, &refusal);
    if (!refusal.empty()) {
      context.skipped(kPass, site, refusal);
      return std::nullopt;
    }
    const Op& writer = fusion.op ? *fusion.op : *graph.ops[producer];
    const double saved = 2 * 4.0 * static_cast<double>(graph.numel(fp32_value));
    fusion.absorbed = {producer, op_index};
    fusion.site = site;
    fusion.what = std::string(graph.ops[producer]->kind()) + "+cast -> " + writer.kind() +
                  " writes bf16 (fp32 write and read of " + kib(saved / 2) + " each saved)";
    return fusion;
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_cast_pass() {
  return std::make_unique<CastPass>();
}

}  // namespace ft

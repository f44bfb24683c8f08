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
//   FlashAttention -> cast (the attention output feeding the projection)
//                                   => flash attention writes y in bf16 (its backward then takes
//                                      D = <dY, Y> on the rounded Y, so this pair agrees with
//                                      its twin to bf16 rounding, not bit for bit)
//   QkvLinear -> q, k, v views -> one cast each
//                                   => the QKV GEMM writes a bf16 [rows, 3C] root (oneDNN
//                                      rounding C as it stores it, or, without bf16 instructions,
//                                      fp32 row tiles rounded in cache), and the casts' outputs
//                                      become its column views (all the views' casts or none: one
//                                      dtype per root); attention reads them in place
// Order: after qkv, gemm_epilogue, residual_layernorm and bn_relu, whose fused producers it
// rewrites, and after attention, which absorbs the probabilities' cast itself (PassInfo::after);
// nothing runs after it that matches casts. Casts do not count against fusion.max_ops
// (counted_ops, fusion/pass_util.h). Producers not listed (the eager attention mix, the
// embedding, the ResNet's pooling) keep their cast, with the reason in `plan`; so does a ResNet
// block output that an identity shortcut also reads. Thread safety: stateless.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fusion/ops/layernorm_cast.h"
#include "fusion/ops/linear_gelu.h"
#include "fusion/ops/qkv_linear.h"
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
    case OpKind::kFlashAttention:
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

// A QKV GEMM's output whose column views are each read by one cast op and nothing else.
struct ViewCasts {
  const Op* producer = nullptr;
  std::vector<const Op*> casts;  // in view order
};

bool is_qkv_view(const Graph& graph, const GraphIndex& index, ValueId id) {
  if (!graph.values[id].is_view()) return false;
  const int producer = index.producer(graph.values[id].view_of);
  return producer >= 0 && graph.ops[producer]->op_kind() == OpKind::kQkvLinear;
}

// Why the casts of `producer`'s views cannot be absorbed, or "" with `group` filled.
std::string view_casts_refusal(const Graph& graph, const GraphIndex& index, int producer,
                               ViewCasts* group) {
  const ValueId root = graph.ops[producer]->outputs[0];
  const std::string& root_name = graph.values[root].name;
  if (graph.values[root].is_view()) return "'" + root_name + "' is itself a view";
  if (index.is_graph_result(root)) return "'" + root_name + "' is a graph result";
  if (!index.consumers(root).empty())
    return "'" + root_name + "' is read whole by " + graph.ops[index.consumers(root)[0]]->name;
  group->producer = graph.ops[producer].get();
  for (ValueId id = 0; id < static_cast<ValueId>(graph.values.size()); ++id) {
    if (graph.values[id].view_of != root) continue;
    const std::vector<int>& readers = index.consumers(id);
    const Op* reader = readers.size() == 1 ? graph.ops[readers[0]].get() : nullptr;
    if (reader == nullptr || reader->op_kind() != OpKind::kCast)
      return "'" + graph.values[id].name + "' is read " +
             (reader == nullptr ? std::to_string(readers.size()) + " times"
                                : "by " + reader->name + " (" + reader->kind() + ")") +
             ": its fp32 form is needed, and a root has one dtype";
    if (graph.values[reader->outputs[0]].is_view() || index.is_graph_result(reader->outputs[0]))
      return "'" + graph.values[reader->outputs[0]].name + "' is a view or a graph result";
    group->casts.push_back(reader);
  }
  return "";
}

class CastPass : public CandidatePass {
 public:
  const PassInfo& info() const override { return cast_info(); }

  int apply(Graph& graph, PassContext& context) const override {
    const std::vector<ViewCasts> groups = plan_view_casts(graph, context);
    for (const ViewCasts& group : groups) rewrite_view_casts(graph, group, context.options);
    return static_cast<int>(groups.size()) + CandidatePass::apply(graph, context);
  }

 private:
  // The QKV GEMMs whose views' casts can all be absorbed, with a decision for every such cast.
  std::vector<ViewCasts> plan_view_casts(const Graph& graph, PassContext& context) const {
    const GraphIndex index(graph);
    std::vector<ViewCasts> groups;
    for (int op_index = 0; op_index < static_cast<int>(graph.ops.size()); ++op_index) {
      const Op& producer = *graph.ops[op_index];
      if (producer.op_kind() != OpKind::kQkvLinear) continue;
      std::vector<int> casts;  // every cast reading one of its views: the decisions' sites
      for (ValueId id = 0; id < static_cast<ValueId>(graph.values.size()); ++id)
        if (graph.values[id].view_of == producer.outputs[0])
          for (int reader : index.consumers(id))
            if (graph.ops[reader]->op_kind() == OpKind::kCast) casts.push_back(reader);
      if (casts.empty()) continue;
      const std::string site = graph.ops[casts.front()]->name;
      ViewCasts group;
      const std::string refusal = view_casts_refusal(graph, index, op_index, &group);
      if (!refusal.empty()) {
        for (int cast : casts) context.skipped(kPass, graph.ops[cast]->name, refusal);
        continue;
      }
      // No max_ops check: max_ops bounds a chain, and each of q, k and v is a chain of two (its
      // Linear and its cast), within any max_ops at which the QKV pass fused them.
      const double saved = 2 * 4.0 * static_cast<double>(graph.numel(producer.outputs[0]));
      context.fused(kPass, site,
                    std::string(producer.kind()) + "+" + std::to_string(group.casts.size()) +
                        " casts -> " + producer.kind() + " writes bf16, the casts' outputs " +
                        "its views (fp32 write and read of " + kib(saved / 2) + " each saved)",
                    producer.eager_ops + static_cast<int>(group.casts.size()));
      groups.push_back(group);
    }
    return groups;
  }

  // A bf16 root takes the fp32 one's place as the GEMM's output; each cast's output becomes its
  // view at the columns the cast read, and the casts go.
  static void rewrite_view_casts(Graph& graph, const ViewCasts& group,
                                 const FusionOptions& options) {
    const auto& qkv = static_cast<const QkvLinearOp&>(*group.producer);
    const ValueId fp32_root = qkv.outputs[0];
    const ValueId bf16_root = graph.add_value(graph.values[fp32_root].name + ".bf16",
                                              graph.values[fp32_root].shape, DType::kBF16);
    for (const Op* cast : group.casts)
      make_view(graph, cast->outputs[0], bf16_root, graph.values[cast->inputs[0]].column_offset);
    std::vector<const Op*> ops = {group.producer};
    ops.insert(ops.end(), group.casts.begin(), group.casts.end());
    Fusion fusion = fusion_like(qkv);
    fusion.absorbed = op_indices(graph, ops);
    fusion.placement = Placement::kFirst;
    fusion.outputs = {bf16_root};
    // The row tiles of the CPU path without bf16 instructions: even tiles of at most
    // fusion.tile_kb (one row at least): 1024 rows of 3 KiB in 1 MiB are three tiles of 342
    // rows, not 341 + 341 + 341 + 1.
    const int64_t fitting =
        std::max<int64_t>(rows_per_tile(options.tile_kb, qkv.out_features()), 1);
    const int64_t tiles = (qkv.rows() + fitting - 1) / fitting;
    fusion.op = std::make_unique<QkvLinearOp>(qkv.rows(), qkv.in_features(), qkv.width(),
                                              qkv.count(), qkv.has_bias(), qkv.weight_row_offset(),
                                              (qkv.rows() + tiles - 1) / tiles);
    apply_fusion(graph, std::move(fusion));
  }

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
    // The QKV GEMM's views were decided with their siblings (plan_view_casts).
    if (is_qkv_view(graph, index, fp32_value)) return std::nullopt;
    // Views first: a view's producer writes its root (a batched output), not the view.
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
        !within_max_ops(context, kPass, site,
                        counted_ops(graph.ops[producer]->eager_ops + cast.eager_ops,
                                    graph.ops[producer]->eager_casts + cast.eager_casts)))
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

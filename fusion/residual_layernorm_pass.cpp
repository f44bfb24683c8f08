// fusion.vertical.residual_layernorm: [DropoutOp ->] ResidualAddOp -> LayerNormOp becomes one
// ResidualLayerNormOp that writes both the residual stream and the normalised row. The unfused
// twin is that chain itself; tests/fusion_residual_layernorm_test.cpp checks the two agree.
// Candidates are every residual add (the LayerNorm fused is the first one reading its sum; the
// sum usually has other readers too, the next residual add: it stays a graph value) and every
// full-width LayerNorm that does not read a residual sum (ln_1 of block 0 reads the embedding's
// dropout), which is skipped with its reason. Per-head LayerNorms over column views are
// batched_layernorm's, not candidates here. A dropout is absorbed only when the add is the one
// reader of its output; with max_ops 2 the add and the LayerNorm fuse and the dropout stays.
// Order: none of its own (PassInfo::after is empty); cast runs after it, to make the normalised
// output of ResidualLayerNormOp bf16.
// Thread safety: stateless.
#include <algorithm>
#include <string>
#include <vector>

#include "fusion/ops/residual_layernorm.h"
#include "fusion/passes.h"
#include "fusion/rewrite.h"
#include "model/graph_edit.h"
#include "model/ops/dropout.h"
#include "model/ops/layernorm.h"

namespace ft {
namespace {

const char* const kPass = residual_layernorm_info().name;

ValueId root_of(const Graph& graph, ValueId id) {
  return graph.values[id].is_view() ? graph.values[id].view_of : id;
}

bool is_kind(const Graph& graph, int op_index, OpKind kind) {
  return op_index >= 0 && graph.ops[op_index]->op_kind() == kind;
}

// "h.0.residual_1" and "h.0.ln_2" -> "h.0.residual_1+ln_2"; "h.0.residual_2" and "h.1.ln_1"
// -> "h.0.residual_2+h.1.ln_1": the LayerNorm keeps its prefix when it lies in another block.
std::string fused_name(const std::string& residual, const std::string& layernorm) {
  const size_t dot = residual.rfind('.');
  const std::string prefix = dot == std::string::npos ? "" : residual.substr(0, dot + 1);
  const bool same_block = !prefix.empty() && layernorm.compare(0, prefix.size(), prefix) == 0;
  return residual + "+" + (same_block ? layernorm.substr(prefix.size()) : layernorm);
}

// The first LayerNorm in forward order reading `sum` itself; -1 if none.
int first_layernorm_reader(const Graph& graph, const GraphIndex& index, ValueId sum) {
  for (int reader : index.consumers(sum))
    if (is_kind(graph, reader, OpKind::kLayerNorm)) return reader;
  return -1;
}

// An op strictly between `first` and `last` reading `value` or a view of it; -1 if none. Such
// an op would read the sum before the fused op (placed at the LayerNorm) writes it.
int reader_between(const Graph& graph, ValueId value, int first, int last) {
  for (int op_index = first + 1; op_index < last; ++op_index)
    for (ValueId id : graph.ops[op_index]->inputs)
      if (root_of(graph, id) == value) return op_index;
  return -1;
}

// A chain to replace, held by op identity: earlier rewrites shift indices.
struct Plan {
  const Op* dropout = nullptr;  // absorbed, or null
  const Op* residual = nullptr;
  const Op* layernorm = nullptr;
  ValueId residual_in = -1, branch = -1;  // the fused op's inputs
  int tile_rows = 1;
};

class ResidualLayerNormPass : public FusionPass {
 public:
  const PassInfo& info() const override { return residual_layernorm_info(); }

  int apply(Graph& graph, PassContext& context) const override {
    const GraphIndex index(graph);
    std::vector<Plan> plans;
    for (int op_index = 0; op_index < static_cast<int>(graph.ops.size()); ++op_index) {
      if (is_kind(graph, op_index, OpKind::kLayerNorm))
        note_lone_layernorm(graph, index, op_index, context);
      if (is_kind(graph, op_index, OpKind::kResidualAdd)) {
        Plan plan;
        if (decide(graph, index, op_index, context, plan)) plans.push_back(plan);
      }
    }
    for (const Plan& plan : plans) rewrite(graph, plan);
    return static_cast<int>(plans.size());
  }

 private:
  // A full-width LayerNorm whose input is no residual sum, or which is not the sum's first
  // LayerNorm reader: nothing to fuse it with, said so.
  static void note_lone_layernorm(const Graph& graph, const GraphIndex& index, int op_index,
                                  PassContext& context) {
    const Op& layernorm = *graph.ops[op_index];
    const ValueId input = layernorm.inputs.at(0);
    if (graph.values[input].is_view()) return;  // per-head: batched_layernorm's candidate
    const int producer = index.producer(input);
    const std::string& input_name = graph.values[input].name;
    if (!is_kind(graph, producer, OpKind::kResidualAdd)) {
      const std::string source =
          producer < 0 ? "a graph input" : std::string(graph.ops[producer]->kind());
      context.skipped(kPass, layernorm.name,
                      "input '" + input_name + "' comes from " + source + ", not a residual add");
      return;
    }
    if (first_layernorm_reader(graph, index, input) != op_index)
      context.skipped(kPass, layernorm.name,
                      "not the first LayerNorm reading '" + input_name + "'");
  }

  // ShouldFuse for the residual add at `op_index`: fills `plan` and records the decision.
  static bool decide(const Graph& graph, const GraphIndex& index, int op_index,
                     PassContext& context, Plan& plan) {
    const Op& residual = *graph.ops[op_index];
    const std::string& site = residual.name;
    const ValueId sum = residual.outputs.at(0);
    const int ln_index = first_layernorm_reader(graph, index, sum);
    if (ln_index < 0) {
      context.skipped(kPass, site, "no LayerNorm reads '" + graph.values[sum].name + "'");
      return false;
    }
    const auto& layernorm = static_cast<const LayerNormOp&>(*graph.ops[ln_index]);
    if (layernorm.rows() * layernorm.channels() != graph.numel(sum)) {
      context.skipped(kPass, site, "LayerNorm '" + layernorm.name + "' shape differs from the sum");
      return false;
    }
    const int early_reader = reader_between(graph, sum, op_index, ln_index);
    if (early_reader >= 0) {
      context.skipped(kPass, site,
                      "'" + graph.ops[early_reader]->name + "' reads the sum before LayerNorm '" +
                          layernorm.name + "'");
      return false;
    }
    const int max_ops = context.options.max_ops;
    if (max_ops < 2) {
      context.skipped(kPass, site, "max_ops " + std::to_string(max_ops));
      return false;
    }
    const int64_t row_bytes = ResidualLayerNormOp::live_bytes_per_row(layernorm.channels());
    const int64_t tile_bytes = static_cast<int64_t>(context.options.tile_kb) * 1024;
    if (row_bytes > tile_bytes) {
      context.skipped(kPass, site,
                      "tile_kb " + std::to_string(context.options.tile_kb) + " < " +
                          std::to_string(row_bytes) + " bytes of intermediates per row");
      return false;
    }
    plan.residual = &residual;
    plan.layernorm = &layernorm;
    plan.residual_in = residual.inputs.at(0);
    plan.branch = residual.inputs.at(1);
    plan.tile_rows = static_cast<int>(std::min<int64_t>(tile_bytes / row_bytes, layernorm.rows()));
    const int dropout_index = absorbable_dropout(graph, index, residual);
    std::string what = "residual+layernorm";
    int absorbed = 2;
    if (dropout_index >= 0 && max_ops < 3) {
      what += " (dropout '" + graph.ops[dropout_index]->name + "' left unfused: max_ops " +
              std::to_string(max_ops) + ")";
    } else if (dropout_index >= 0) {
      const Op& dropout = *graph.ops[dropout_index];
      plan.dropout = &dropout;
      if (dropout.outputs[0] == residual.inputs[0]) plan.residual_in = residual.inputs[1];
      plan.branch = dropout.inputs.at(0);
      what = "dropout+" + what;
      absorbed = 3;
    }
    if (plan.residual_in == plan.branch) {
      context.skipped(kPass, site, "both summands are '" + graph.values[plan.branch].name + "'");
      return false;
    }
    context.fused(kPass, site, what + " -> " + layernorm.name, absorbed);
    return true;
  }

  // The DropoutOp writing one summand (the second preferred) whose only reader is the add.
  static int absorbable_dropout(const Graph& graph, const GraphIndex& index, const Op& residual) {
    for (int side : {1, 0}) {
      const ValueId summand = residual.inputs.at(side);
      const int producer = index.producer(summand);
      if (!is_kind(graph, producer, OpKind::kDropout)) continue;
      if (index.consumers(summand).size() != 1 || index.reader_count_with_views(summand) != 1 ||
          index.is_graph_result(summand))
        continue;
      return producer;
    }
    return -1;
  }

  // Fuse: the replacement takes the LayerNorm's place, after every op that feeds the chain.
  static void rewrite(Graph& graph, const Plan& plan) {
    const auto& layernorm = static_cast<const LayerNormOp&>(*plan.layernorm);
    float p = 0.0f;
    uint64_t salt = 0;
    if (plan.dropout != nullptr) {
      const auto& dropout = static_cast<const DropoutOp&>(*plan.dropout);
      p = dropout.p();
      salt = dropout.salt();
    }
    Fusion fusion;
    fusion.op = std::make_unique<ResidualLayerNormOp>(layernorm.rows(), layernorm.channels(), p,
                                                      salt, plan.tile_rows);
    fusion.name = fused_name(plan.residual->name, layernorm.name);
    fusion.inputs = {plan.residual_in, plan.branch};
    fusion.outputs = {plan.residual->outputs[0], layernorm.outputs[0]};
    fusion.params = layernorm.params;
    std::vector<const Op*> absorbed = {plan.residual, plan.layernorm};
    if (plan.dropout != nullptr) absorbed.push_back(plan.dropout);
    fusion.absorbed = op_indices(graph, absorbed);
    apply_fusion(graph, std::move(fusion));
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_residual_layernorm_pass() {
  return std::make_unique<ResidualLayerNormPass>();
}

}  // namespace ft

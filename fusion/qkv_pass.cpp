// fusion.horizontal.qkv: Linears that read the same input and own consecutive row blocks of one
// weight (the eager GPT's q, k and v over c_attn) become one QkvLinearOp writing a new
// [rows, N·out] root "<prefix>.qkv"; each original output becomes a column view of it, so its
// consumers (per-head LayerNorms, attention) read q, k and v in place. The unfused twin is the N
// LinearOps themselves; tests/fusion_qkv_test.cpp checks the two agree.
// Order: none of its own (PassInfo::after is empty); attention runs after it, so that it finds q,
// k and v as views of the one QKV output.
// Thread safety: stateless.
#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "fusion/ops/qkv_linear.h"
#include "fusion/passes.h"
#include "fusion/rewrite.h"
#include "model/graph_edit.h"
#include "model/ops/linear.h"

namespace ft {
namespace {

const char* const kPass = qkv_info().name;

// The part of the names up to and including their last common '.': "h.0.attn." for
// "h.0.attn.q" and "h.0.attn.v".
std::string common_prefix(const std::vector<const Op*>& ops) {
  std::string prefix = ops.front()->name;
  for (const Op* op : ops) {
    size_t length = 0;
    while (length < prefix.size() && length < op->name.size() && prefix[length] == op->name[length])
      ++length;
    prefix.resize(length);
  }
  const size_t dot = prefix.rfind('.');
  return dot == std::string::npos ? std::string() : prefix.substr(0, dot + 1);
}

// Why `linear`'s output cannot become a view of a shared root, or "" when it can.
std::string view_refusal(const Graph& graph, const GraphIndex& index, const Op& linear) {
  const ValueId out = linear.outputs[0];
  const std::string& name = graph.values[out].name;
  if (index.is_graph_result(out)) return "'" + name + "' is a graph result";
  if (graph.values[out].is_view()) return "'" + name + "' is already a view";
  std::vector<ValueId> read_as = {out};
  for (ValueId id = 0; id < static_cast<ValueId>(graph.values.size()); ++id)
    if (graph.values[id].view_of == out) read_as.push_back(id);
  for (ValueId id : read_as)
    for (int reader : index.consumers(id))
      if (!graph.ops[reader]->supports_views())
        return "'" + name + "' is read by " + graph.ops[reader]->name + " (" +
               graph.ops[reader]->kind() + "), which does not support views";
  return "";
}

// Why an op strictly between the group's first and last reads one of the group's outputs (the
// fused op runs at the last one's position), or "".
std::string order_refusal(const Graph& graph, const std::vector<int>& group) {
  std::vector<ValueId> produced;
  for (int op_index : group) {
    const ValueId out = graph.ops[op_index]->outputs[0];
    produced.push_back(out);
    for (ValueId id = 0; id < static_cast<ValueId>(graph.values.size()); ++id)
      if (graph.values[id].view_of == out) produced.push_back(id);
  }
  for (int between = group.front() + 1; between < group.back(); ++between) {
    if (std::find(group.begin(), group.end(), between) != group.end()) continue;
    for (ValueId id : graph.ops[between]->inputs)
      if (std::find(produced.begin(), produced.end(), id) != produced.end())
        return graph.ops[between]->name + " reads '" + graph.values[id].name +
               "' before the group's last Linear";
  }
  return "";
}

// Linears that may share one GEMM: same input, weight, bias, and shape.
using GroupKey = std::tuple<ValueId, ParamId, ParamId, bool, int64_t, int64_t, int64_t>;

GroupKey key_of(const LinearOp& linear) {
  return {linear.inputs[0],     linear.params[0], linear.has_bias() ? linear.params[1] : -1,
          linear.has_bias(),    linear.rows(),    linear.in_features(),
          linear.out_features()};
}

class QkvPass : public FusionPass {
 public:
  const PassInfo& info() const override { return qkv_info(); }

  int apply(Graph& graph, PassContext& context) const override {
    // Plan on the unmodified graph, then rewrite group by group (found again by op identity, as
    // each rewrite renumbers the ops after it).
    const std::vector<std::vector<const Op*>> groups = plan(graph, context);
    for (size_t g = 0; g < groups.size(); ++g) rewrite(graph, groups[g]);
    return static_cast<int>(groups.size());
  }

 private:
  std::vector<std::vector<const Op*>> plan(const Graph& graph, PassContext& context) const {
    const GraphIndex index(graph);
    // Linears by weight parameter, in op order.
    std::map<ParamId, std::vector<int>> by_weight;
    for (int op_index = 0; op_index < static_cast<int>(graph.ops.size()); ++op_index)
      if (graph.ops[op_index]->op_kind() == OpKind::kLinear)
        by_weight[graph.ops[op_index]->params[0]].push_back(op_index);

    std::vector<std::vector<const Op*>> groups;
    for (const auto& [weight, sharing] : by_weight) {
      if (sharing.size() < 2) continue;  // a Linear alone on its weight is no candidate
      std::map<GroupKey, std::vector<int>> by_key;
      for (int op_index : sharing)
        by_key[key_of(static_cast<const LinearOp&>(*graph.ops[op_index]))].push_back(op_index);
      for (auto& [key, members] : by_key) {
        if (members.size() < 2) {
          const bool same_input = std::any_of(sharing.begin(), sharing.end(), [&](int other) {
            return other != members[0] && graph.ops[other]->inputs[0] == std::get<0>(key);
          });
          context.skipped(kPass, graph.ops[members[0]]->name,
                          same_input ? "bias or shape differs from the Linears sharing its weight"
                                     : "inputs differ from the Linears sharing its weight");
          continue;
        }
        plan_runs(graph, index, members, context, &groups);
      }
    }
    return groups;
  }

  // Splits Linears of one key into runs of contiguous row offsets, then into groups of at most
  // max_ops, recording a decision for each.
  void plan_runs(const Graph& graph, const GraphIndex& index, std::vector<int> members,
                 PassContext& context, std::vector<std::vector<const Op*>>* groups) const {
    auto linear = [&](int op_index) -> const LinearOp& {
      return static_cast<const LinearOp&>(*graph.ops[op_index]);
    };
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return linear(a).weight_row_offset() < linear(b).weight_row_offset();
    });
    std::vector<std::vector<int>> runs;
    for (int op_index : members) {
      const std::string refusal = view_refusal(graph, index, linear(op_index));
      if (!refusal.empty()) {
        context.skipped(kPass, linear(op_index).name, refusal);
        runs.emplace_back();  // an unfusable Linear breaks the run
        continue;
      }
      const bool extends =
          !runs.empty() && !runs.back().empty() &&
          linear(runs.back().back()).weight_row_offset() + linear(op_index).out_features() ==
              linear(op_index).weight_row_offset();
      if (!extends) runs.emplace_back();
      runs.back().push_back(op_index);
    }
    const int max_ops = context.options.max_ops;
    for (const std::vector<int>& run : runs) {
      if (run.empty()) continue;
      if (run.size() == 1) {
        const LinearOp& alone = linear(run[0]);
        const bool has_neighbour = std::any_of(members.begin(), members.end(), [&](int other) {
          const LinearOp& o = linear(other);
          return o.weight_row_offset() + o.out_features() == alone.weight_row_offset() ||
                 alone.weight_row_offset() + alone.out_features() == o.weight_row_offset();
        });
        context.skipped(kPass, alone.name,
                        has_neighbour
                            ? "its contiguous neighbours cannot be fused"
                            : "weight row offset " + std::to_string(alone.weight_row_offset()) +
                                  " is not contiguous with another Linear on the same input");
        continue;
      }
      const bool split = static_cast<int>(run.size()) > max_ops;
      for (size_t first = 0; first < run.size(); first += std::max(max_ops, 1)) {
        const size_t count =
            std::min(run.size() - first, static_cast<size_t>(std::max(max_ops, 1)));
        std::vector<int> group(run.begin() + first, run.begin() + first + count);
        const std::string& site = linear(group[0]).name;
        if (count < 2) {
          context.skipped(kPass, site, "max_ops " + std::to_string(max_ops));
          continue;
        }
        std::vector<int> in_order = group;
        std::sort(in_order.begin(), in_order.end());
        const std::string refusal = order_refusal(graph, in_order);
        if (!refusal.empty()) {
          context.skipped(kPass, site, refusal);
          continue;
        }
        std::string what = std::to_string(count) + " linears -> one GEMM";
        if (split) what += " (split at max_ops " + std::to_string(max_ops) + ")";
        context.fused(kPass, site, what, static_cast<int>(count));
        std::vector<const Op*> ops;
        for (int op_index : group) ops.push_back(graph.ops[op_index].get());
        groups->push_back(ops);
      }
    }
  }

  // `linears` in weight row order.
  void rewrite(Graph& graph, const std::vector<const Op*>& linears) const {
    const auto& first = static_cast<const LinearOp&>(*linears.front());
    const int count = static_cast<int>(linears.size());
    const int64_t width = first.out_features();

    const std::string prefix = common_prefix(linears);
    std::string name = prefix + "qkv";
    for (int suffix = 1; std::any_of(graph.values.begin(), graph.values.end(),
                                     [&](const Value& v) { return v.name == name; });
         ++suffix)
      name = prefix + "qkv" + std::to_string(suffix);
    Shape shape = graph.shape(first.outputs[0]);
    shape.back() = width * count;
    const ValueId root = graph.add_value(name, shape);
    bool needs_grad = false;
    for (int n = 0; n < count; ++n) {
      const ValueId out = linears[n]->outputs[0];
      needs_grad = needs_grad || graph.values[out].needs_grad;
      make_view(graph, out, root, n * width);
    }
    graph.values[root].needs_grad = needs_grad;

    Fusion fusion;
    fusion.absorbed = op_indices(graph, linears);
    fusion.op = std::make_unique<QkvLinearOp>(first.rows(), first.in_features(), width, count,
                                              first.has_bias(), first.weight_row_offset());
    fusion.name = name;
    fusion.inputs = first.inputs;
    fusion.outputs = {root};
    fusion.params = first.params;  // the Linears share one weight (and bias)
    apply_fusion(graph, std::move(fusion));
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_qkv_pass() {
  return std::make_unique<QkvPass>();
}

}  // namespace ft

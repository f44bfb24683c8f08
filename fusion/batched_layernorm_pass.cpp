// fusion.horizontal.batched_layernorm: a consecutive run of independent LayerNorms of one shape
// (qk_norm's per-head LayerNorms: n_head over q's columns, then n_head over k's) becomes one
// BatchedLayerNormOp, split greedily at max_ops. The unfused twin is the run of LayerNormOps
// itself; tests/fusion_qkv_test.cpp checks the two agree.
// Order: none (PassInfo::after is empty).
// Thread safety: stateless.
#include <algorithm>
#include <string>
#include <vector>

#include "fusion/ops/batched_layernorm.h"
#include "fusion/passes.h"
#include "fusion/rewrite.h"
#include "model/graph_edit.h"
#include "model/ops/layernorm.h"

namespace ft {
namespace {

const char* const kPass = batched_layernorm_info().name;

ValueId root_of(const Graph& graph, ValueId id) {
  return graph.values[id].is_view() ? graph.values[id].view_of : id;
}

// The names' common part up to and including its last '.': "h.0.attn." for
// "h.0.attn.q_norm.0" and "h.0.attn.k_norm.3".
std::string common_prefix(const Graph& graph, const std::vector<int>& ops) {
  std::string prefix = graph.ops[ops.front()]->name;
  for (int op_index : ops) {
    const std::string& name = graph.ops[op_index]->name;
    size_t length = 0;
    while (length < prefix.size() && length < name.size() && prefix[length] == name[length])
      ++length;
    prefix.resize(length);
  }
  const size_t dot = prefix.rfind('.');
  return dot == std::string::npos ? std::string() : prefix.substr(0, dot + 1);
}

// True if LayerNorm `op_index` reads (the root of) a value one of `earlier` writes: it then
// depends on that LayerNorm and cannot run in the same launch. Comparing roots is conservative:
// two heads' views of one root count as dependent even when their columns differ.
bool reads_output_of(const Graph& graph, int op_index, const std::vector<int>& earlier) {
  const ValueId read = root_of(graph, graph.ops[op_index]->inputs[0]);
  return std::any_of(earlier.begin(), earlier.end(), [&](int other) {
    return root_of(graph, graph.ops[other]->outputs[0]) == read;
  });
}

const LayerNormOp* as_layernorm(const Graph& graph, int op_index) {
  const Op& op = *graph.ops[op_index];
  return op.op_kind() == OpKind::kLayerNorm ? static_cast<const LayerNormOp*>(&op) : nullptr;
}

// LayerNorms to replace by one op, and its name.
struct Group {
  std::vector<int> ops;  // consecutive op indices
  std::string name;      // "h.0.attn.batched_layernorm", with ".<part>" when split
};

class BatchedLayerNormPass : public FusionPass {
 public:
  const PassInfo& info() const override { return batched_layernorm_info(); }

  int apply(Graph& graph, PassContext& context) const override {
    // Runs of consecutive ops, planned first; rewritten last to first so earlier indices hold.
    std::vector<Group> groups;
    for (const std::vector<int>& run : independent_runs(graph)) {
      if (run.size() < 2) continue;  // a lone LayerNorm is no candidate
      const int max_ops = std::max(context.options.max_ops, 1);
      const bool split = static_cast<int>(run.size()) > max_ops;
      for (size_t first = 0; first < run.size(); first += max_ops) {
        const size_t count = std::min(run.size() - first, static_cast<size_t>(max_ops));
        const std::string& site = graph.ops[run[first]]->name;
        if (count < 2) {
          context.skipped(kPass, site, "max_ops " + std::to_string(context.options.max_ops));
          continue;
        }
        std::string what = std::to_string(count) + " layernorms -> one batched op";
        if (split) what += " (split at max_ops " + std::to_string(max_ops) + ")";
        context.fused(kPass, site, what, static_cast<int>(count));
        Group group;
        group.ops.assign(run.begin() + first, run.begin() + first + count);
        group.name = common_prefix(graph, run) + "batched_layernorm";
        if (split) group.name += "." + std::to_string(first / max_ops);
        groups.push_back(std::move(group));
      }
    }
    for (auto group = groups.rbegin(); group != groups.rend(); ++group) rewrite(graph, *group);
    return static_cast<int>(groups.size());
  }

 private:
  // Maximal runs of consecutive LayerNorms with equal rows and channels, none reading another's
  // output. As the ops are consecutive, no other op sits between them to carry a dependence.
  static std::vector<std::vector<int>> independent_runs(const Graph& graph) {
    std::vector<std::vector<int>> runs;
    const LayerNormOp* previous = nullptr;
    for (int op_index = 0; op_index < static_cast<int>(graph.ops.size()); ++op_index) {
      const LayerNormOp* layernorm = as_layernorm(graph, op_index);
      if (layernorm == nullptr) {
        previous = nullptr;
        continue;
      }
      const bool extends = previous != nullptr && previous->rows() == layernorm->rows() &&
                           previous->channels() == layernorm->channels() &&
                           !reads_output_of(graph, op_index, runs.back());
      if (!extends) runs.emplace_back();
      runs.back().push_back(op_index);
      previous = layernorm;
    }
    return runs;
  }

  // Consecutive ops need no check that an op between them reads their outputs.
  static void rewrite(Graph& graph, const Group& group) {
    const auto& first = static_cast<const LayerNormOp&>(*graph.ops[group.ops.front()]);
    const int count = static_cast<int>(group.ops.size());
    Fusion fusion;
    fusion.absorbed = group.ops;
    fusion.op = std::make_unique<BatchedLayerNormOp>(first.rows(), first.channels(), count);
    fusion.name = group.name;
    for (int op_index : group.ops) {
      const Op& layernorm = *graph.ops[op_index];
      fusion.inputs.push_back(layernorm.inputs[0]);
      fusion.outputs.push_back(layernorm.outputs[0]);
      fusion.params.push_back(layernorm.params[0]);
      fusion.params.push_back(layernorm.params[1]);
    }
    apply_fusion(graph, std::move(fusion));
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_batched_layernorm_pass() {
  return std::make_unique<BatchedLayerNormPass>();
}

}  // namespace ft

#include "fusion/rewrite.h"

#include <algorithm>

#include "core/check.h"

namespace ft {

Fusion fusion_like(const Op& op) {
  Fusion fusion;
  fusion.name = op.name;
  fusion.inputs = op.inputs;
  fusion.outputs = op.outputs;
  fusion.params = op.params;
  return fusion;
}

int apply_fusion(Graph& graph, Fusion fusion) {
  std::vector<int> absorbed = fusion.absorbed;
  std::sort(absorbed.begin(), absorbed.end());
  absorbed.erase(std::unique(absorbed.begin(), absorbed.end()), absorbed.end());
  FT_CHECK(!absorbed.empty() && absorbed.front() >= 0 &&
               absorbed.back() < static_cast<int>(graph.ops.size()),
           "apply_fusion: absorbed op indices out of range");
  int eager_ops = 0, eager_casts = 0;
  for (int op_index : absorbed) {
    eager_ops += graph.ops[op_index]->eager_ops;
    eager_casts += graph.ops[op_index]->eager_casts;
  }
  std::unique_ptr<Op> op = std::move(fusion.op);
  if (!op) {
    FT_CHECK(fusion.placement == Placement::kFirst,
             "apply_fusion: the op that stays must be the first absorbed one");
    op = std::move(graph.ops[absorbed.front()]);
  }
  op->name = std::move(fusion.name);
  op->inputs = std::move(fusion.inputs);
  op->outputs = std::move(fusion.outputs);
  op->params = std::move(fusion.params);
  op->eager_ops = eager_ops;
  op->eager_casts = eager_casts;
  for (ValueId id : fusion.no_grad) graph.values.at(id).needs_grad = false;
  if (fusion.placement == Placement::kLast) {
    replace_op_set(graph, absorbed, std::move(op));
  } else {
    for (auto it = absorbed.rbegin(); it + 1 != absorbed.rend(); ++it)
      graph.ops.erase(graph.ops.begin() + *it);
    graph.ops[absorbed.front()] = std::move(op);
  }
  return eager_ops;
}

std::vector<int> op_indices(const Graph& graph, const std::vector<const Op*>& ops) {
  std::vector<int> indices;
  for (const Op* wanted : ops) {
    int found = -1;
    for (int op_index = 0; op_index < static_cast<int>(graph.ops.size()) && found < 0; ++op_index)
      if (graph.ops[op_index].get() == wanted) found = op_index;
    FT_CHECK(found >= 0, "op_indices: an op is not in the graph");
    indices.push_back(found);
  }
  return indices;
}

}  // namespace ft

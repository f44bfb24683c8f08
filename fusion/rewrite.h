// The doing half of a fusion pass, written once (XLA's InstructionFusion driver, torch.fx's
// replace_pattern): a pass says which ops it matched and what op stands for them (a Fusion);
// apply_fusion wires that op and puts it in their place, and fuse_each walks the graph, asking
// the pass's decider about each candidate and keeping the op index right after each rewrite.
// CandidatePass is the base of a pass that only says what a candidate is and decides it.
// A fused op inherits its eager-op count from the ops it absorbs (their sum), so a fused op that
// absorbs another (cast into linear_gelu) counts every eager op it stands for.
// Thread safety: pure functions of the graph they are handed; the caller owns it.
#pragma once
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fusion/pass.h"
#include "model/graph_edit.h"

namespace ft {

// Where the fused op goes among the positions of the ops it absorbs.
enum class Placement {
  kLast,   // where the last absorbed op was: every value the chain reads is written by then
  kFirst,  // where the first was: readers of any of its outputs come after it
};

// One rewrite a pass decided on.
struct Fusion {
  std::vector<int> absorbed;  // op indices of the matched ops, any order
  // The op standing for them; null: the first absorbed op itself stays, rewired with the fields
  // below, and takes the others in (a producer that absorbs the cast after it).
  std::unique_ptr<Op> op;
  Placement placement = Placement::kLast;
  std::string name;  // the fused op's wiring, copied onto it
  std::vector<ValueId> inputs, outputs;
  std::vector<ParamId> params;
  std::vector<ValueId> no_grad;  // values no op reads the gradient of any more
  std::string site, what;        // the decision plan prints (fuse_each records it)
};

// A Fusion wired as `op` is: its name, inputs, outputs and params.
Fusion fusion_like(const Op& op);

// Wires the fused op (eager_ops = the sum of the absorbed ops'), puts it in place of the absorbed
// ops and returns its eager_ops. REQUIRES: no op between the absorbed ones reads a value that only
// they write and the fused op does not (replace_op_set); the rewrite leaves a valid graph.
int apply_fusion(Graph& graph, Fusion fusion);

// The indices of `ops`, in the order given, for passes that plan all rewrites before making any (op
// indices shift with each rewrite; op identity does not). REQUIRES: each op is in the graph.
std::vector<int> op_indices(const Graph& graph, const std::vector<const Op*>& ops);

// Walks the ops in order. For each op `is_candidate(op)` accepts, builds a fresh GraphIndex and
// calls `decide(op_index, index)`, which returns the Fusion to apply or nullopt, having recorded
// its reason with context.skipped. Applies each Fusion, records it with context.fused and goes on
// with the first op after the candidate that the rewrite did not absorb. Returns the fusions made.
template <typename IsCandidate, typename Decide>
int fuse_each(Graph& graph, PassContext& context, const char* pass, IsCandidate is_candidate,
              Decide decide) {
  int fused = 0;
  for (int op_index = 0; op_index < static_cast<int>(graph.ops.size()); ++op_index) {
    if (!is_candidate(*graph.ops[op_index])) continue;
    const GraphIndex index(graph);
    std::optional<Fusion> fusion = decide(op_index, index);
    if (!fusion) continue;
    const std::string site = fusion->site, what = fusion->what;
    const Op* next = nullptr;  // the first op after the candidate that stays
    for (int later = op_index + 1; later < static_cast<int>(graph.ops.size()) && !next; ++later)
      if (std::find(fusion->absorbed.begin(), fusion->absorbed.end(), later) ==
          fusion->absorbed.end())
        next = graph.ops[later].get();
    const int eager_ops = apply_fusion(graph, std::move(*fusion));
    context.fused(pass, site, what, eager_ops);
    ++fused;
    op_index = (next ? op_indices(graph, {next})[0] : static_cast<int>(graph.ops.size())) - 1;
  }
  return fused;
}

// A pass that decides one candidate op at a time (XLA's one driver, many deciders): apply()
// runs fuse_each over the ops is_candidate() accepts, asking decide() about each.
class CandidatePass : public FusionPass {
 public:
  int apply(Graph& graph, PassContext& context) const override {
    return fuse_each(
        graph, context, name(), [this](const Op& op) { return is_candidate(op); },
        [&](int op_index, const GraphIndex& index) {
          return decide(graph, index, op_index, context);
        });
  }

 protected:
  virtual bool is_candidate(const Op& op) const = 0;
  // The Fusion for the candidate at `op_index`, or nullopt with the skip recorded in `context`
  // (or no decision at all, for an op that turns out to be no candidate).
  virtual std::optional<Fusion> decide(const Graph& graph, const GraphIndex& index, int op_index,
                                       PassContext& context) const = 0;
};

}  // namespace ft

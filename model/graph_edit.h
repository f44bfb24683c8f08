// Graph editing for fusion passes: who produces and who reads each value, replacing a run of ops
// by one op, turning a root value into a view, dropping dead values, and the verifier that the
// pipeline runs after every pass (torch.fx's Graph.lint, XLA's HloVerifier).
// Thread safety: pure functions of the graph they are handed; the caller owns it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/graph.h"

namespace ft {

// Producer and consumers of every value, as op indices; rebuilt after each edit.
class GraphIndex {
 public:
  explicit GraphIndex(const Graph& graph);
  // -1 for a graph input, a value no op writes, or a view (see root_producer).
  int producer(ValueId id) const { return producer_.at(id); }
  // Ops reading `id` itself, in forward order (readers of its views are not included).
  const std::vector<int>& consumers(ValueId id) const { return consumers_.at(id); }
  // Ops reading `id`, any view of it, or (for a view) its root or sibling views.
  int reader_count_with_views(ValueId id) const;
  // True if `id` is the graph's output or loss (it must survive rewrites as a buffer).
  bool is_graph_result(ValueId id) const;

 private:
  const Graph& graph_;
  std::vector<int> producer_;
  std::vector<std::vector<int>> consumers_;
};

// Replaces ops [first, first + count) by `replacement`, which takes their place in the list.
// REQUIRES: the run is contiguous in op order and `replacement` is fully wired.
void replace_ops(Graph& graph, int first, int count, std::unique_ptr<Op> replacement);
// Replaces the ops at `op_indices` (any order, not necessarily contiguous) by `replacement`,
// inserted at the position of the last of them. REQUIRES: no op between them reads an output of
// the replaced ops that `replacement` does not also write.
void replace_op_set(Graph& graph, std::vector<int> op_indices, std::unique_ptr<Op> replacement);

// Turns root `id` into a column view of root `base` at `column_offset`; views of `id` are
// re-rooted onto `base`. REQUIRES: `base` is a root whose rows match id's rows.
void make_view(Graph& graph, ValueId id, ValueId base, int64_t column_offset);

// Removes values no op reads or writes (except graph input, output and loss, and roots of live
// views), renumbering every ValueId in ops and the graph. Returns how many were removed.
int remove_dead_values(Graph& graph);

// Throws ft::Error naming the op and value when: an input has no producer earlier in op order
// (and is not the graph input); a value is written twice; a view is wired to an op without
// supports_views(); a view exceeds its root; output/loss are missing.
void validate(const Graph& graph);

}  // namespace ft

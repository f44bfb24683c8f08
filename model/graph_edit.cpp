// Graph editing primitives and the verifier (see graph_edit.h).
#include "model/graph_edit.h"

#include <algorithm>

#include "core/check.h"

namespace ft {
namespace {

ValueId root_of(const Graph& graph, ValueId id) {
  const Value& value = graph.values[id];
  return value.is_view() ? value.view_of : id;
}

}  // namespace

GraphIndex::GraphIndex(const Graph& graph)
    : graph_(graph), producer_(graph.values.size(), -1), consumers_(graph.values.size()) {
  for (int op_index = 0; op_index < static_cast<int>(graph.ops.size()); ++op_index) {
    const Op& op = *graph.ops[op_index];
    for (ValueId id : op.outputs) producer_.at(id) = op_index;
    for (ValueId id : op.inputs) {
      std::vector<int>& readers = consumers_.at(id);
      if (readers.empty() || readers.back() != op_index) readers.push_back(op_index);
    }
  }
}

int GraphIndex::reader_count_with_views(ValueId id) const {
  const ValueId root = root_of(graph_, id);
  std::vector<int> readers;
  for (ValueId other = 0; other < static_cast<ValueId>(graph_.values.size()); ++other)
    if (root_of(graph_, other) == root)
      readers.insert(readers.end(), consumers_[other].begin(), consumers_[other].end());
  std::sort(readers.begin(), readers.end());
  return static_cast<int>(std::unique(readers.begin(), readers.end()) - readers.begin());
}

bool GraphIndex::is_graph_result(ValueId id) const {
  return id == graph_.output || id == graph_.loss;
}

void replace_ops(Graph& graph, int first, int count, std::unique_ptr<Op> replacement) {
  FT_CHECK(first >= 0 && count >= 1 && first + count <= static_cast<int>(graph.ops.size()),
           "replace_ops: run [", first, ", ", first + count, ") outside ", graph.ops.size(),
           " ops");
  graph.ops.erase(graph.ops.begin() + first + 1, graph.ops.begin() + first + count);
  graph.ops[first] = std::move(replacement);
}

void replace_op_set(Graph& graph, std::vector<int> op_indices, std::unique_ptr<Op> replacement) {
  FT_CHECK(!op_indices.empty(), "replace_op_set: no ops");
  std::sort(op_indices.begin(), op_indices.end());
  op_indices.erase(std::unique(op_indices.begin(), op_indices.end()), op_indices.end());
  const int last = op_indices.back();
  FT_CHECK(op_indices.front() >= 0 && last < static_cast<int>(graph.ops.size()),
           "replace_op_set: op index out of range");
  graph.ops[last] = std::move(replacement);
  for (auto it = op_indices.rbegin() + 1; it != op_indices.rend(); ++it)
    graph.ops.erase(graph.ops.begin() + *it);
}

void make_view(Graph& graph, ValueId id, ValueId base, int64_t column_offset) {
  Value& base_value = graph.values.at(base);
  FT_CHECK(!base_value.is_view(), "make_view: base '", base_value.name, "' is itself a view");
  FT_CHECK(!graph.values.at(id).is_view(), "make_view: '", graph.values[id].name,
           "' is already a view");
  const int64_t width = graph.values[id].shape.back();
  const int64_t stride = base_value.shape.back();
  FT_CHECK(graph.numel(id) / width == graph.numel(base) / stride, "make_view: '",
           graph.values[id].name, "' has ", graph.numel(id) / width, " rows, '", base_value.name,
           "' has ", graph.numel(base) / stride);
  FT_CHECK(column_offset >= 0 && column_offset + width <= stride, "make_view: columns of '",
           graph.values[id].name, "' exceed '", base_value.name, "'");
  for (Value& other : graph.values)
    if (other.view_of == id) {
      other.view_of = base;
      other.column_offset += column_offset;
    }
  graph.values[id].view_of = base;
  graph.values[id].column_offset = column_offset;
}

int remove_dead_values(Graph& graph) {
  const ValueId count = static_cast<ValueId>(graph.values.size());
  std::vector<uint8_t> live(count, 0);
  for (const auto& op : graph.ops) {
    for (ValueId id : op->inputs) live[id] = 1;
    for (ValueId id : op->outputs) live[id] = 1;
  }
  for (ValueId id : {graph.input, graph.output, graph.loss})
    if (id >= 0) live[id] = 1;
  for (ValueId id = 0; id < count; ++id)
    if (live[id] && graph.values[id].is_view()) live[graph.values[id].view_of] = 1;
  std::vector<ValueId> new_id(count, -1);
  std::vector<Value> kept;
  for (ValueId id = 0; id < count; ++id)
    if (live[id]) {
      new_id[id] = static_cast<ValueId>(kept.size());
      kept.push_back(graph.values[id]);
    }
  for (Value& value : kept)
    if (value.is_view()) value.view_of = new_id[value.view_of];
  for (auto& op : graph.ops) {
    for (ValueId& id : op->inputs) id = new_id[id];
    for (ValueId& id : op->outputs) id = new_id[id];
  }
  for (ValueId* id : {&graph.input, &graph.output, &graph.loss})
    if (*id >= 0) *id = new_id[*id];
  const int removed = static_cast<int>(count - static_cast<ValueId>(kept.size()));
  graph.values = std::move(kept);
  return removed;
}

void validate(const Graph& graph) {
  const ValueId count = static_cast<ValueId>(graph.values.size());
  FT_CHECK(graph.loss >= 0 && graph.loss < count, "graph has no loss value");
  FT_CHECK(graph.output >= 0 && graph.output < count, "graph has no output value");
  for (ValueId id = 0; id < count; ++id) {
    const Value& value = graph.values[id];
    if (!value.is_view()) continue;
    FT_CHECK(value.view_of < count && !graph.values[value.view_of].is_view(), "view '", value.name,
             "' must view a root value");
    const int64_t stride = graph.values[value.view_of].shape.back();
    FT_CHECK(value.column_offset >= 0 && value.column_offset + value.shape.back() <= stride,
             "view '", value.name, "' exceeds the rows of '", graph.values[value.view_of].name,
             "'");
  }
  // A root is written by its producer; writing a view counts as writing the root's columns, so
  // several ops may write disjoint views of one root (the per-head LayerNorms).
  std::vector<int> writer(count, -1);
  std::vector<uint8_t> written(count, 0);
  if (graph.input >= 0) written[graph.input] = 1;
  for (int op_index = 0; op_index < static_cast<int>(graph.ops.size()); ++op_index) {
    const Op& op = *graph.ops[op_index];
    FT_CHECK(!op.outputs.empty(), "op '", op.name, "' has no outputs");
    for (ValueId id : op.inputs) {
      FT_CHECK(id >= 0 && id < count, "op '", op.name, "' reads value ", id,
               ", which does not exist");
      const Value& value = graph.values[id];
      FT_CHECK(written[id] || (value.is_view() && written[value.view_of]), "op '", op.name,
               "' reads '", value.name, "' before any op writes it");
      FT_CHECK(!value.is_view() || op.supports_views(), "op '", op.name, "' (", op.kind(),
               ") reads the view '", value.name, "' but does not support views");
      FT_CHECK(value.dtype == DType::kF32 || op.handles_bf16(), "op '", op.name, "' (", op.kind(),
               ") reads the bf16 value '", value.name, "' but handles fp32 only");
    }
    for (ValueId id : op.outputs) {
      FT_CHECK(id >= 0 && id < count, "op '", op.name, "' writes value ", id,
               ", which does not exist");
      const Value& value = graph.values[id];
      FT_CHECK(writer[id] < 0, "value '", value.name, "' is written by both '",
               graph.ops[writer[id]]->name, "' and '", op.name, "'");
      FT_CHECK(!value.is_view() || op.supports_views(), "op '", op.name, "' (", op.kind(),
               ") writes the view '", value.name, "' but does not support views");
      FT_CHECK(value.dtype == DType::kF32 || op.handles_bf16(), "op '", op.name, "' (", op.kind(),
               ") writes the bf16 value '", value.name, "' but handles fp32 only");
      writer[id] = op_index;
      written[id] = 1;
      if (value.is_view()) written[value.view_of] = 1;
    }
  }
  FT_CHECK(written[graph.loss], "no op writes the loss '", graph.values[graph.loss].name, "'");
  FT_CHECK(written[graph.output], "no op writes the output '", graph.values[graph.output].name,
           "'");
}

}  // namespace ft

// Builds the `plan` report from graphs: per-op costs, totals and the activation-memory model
// described in app/analysis/plan.h.
#include "app/analysis/plan.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"

namespace ft {
namespace {

constexpr double kFloatBytes = 4.0;

ValueId root_of(const Graph& graph, ValueId id) {
  const Value& value = graph.values.at(id);
  return value.is_view() ? value.view_of : id;
}

// "[8,64,128] 2x[128]": shapes without the spaces shape_str puts after commas, and runs of
// equal shapes counted, to fit the table.
std::string shape_list(const Graph& graph, const std::vector<ValueId>& ids) {
  std::string text;
  for (size_t i = 0; i < ids.size();) {
    size_t run = 1;
    while (i + run < ids.size() && graph.shape(ids[i + run]) == graph.shape(ids[i]) &&
           graph.dtype(ids[i + run]) == graph.dtype(ids[i]))
      ++run;
    if (!text.empty()) text += " ";
    if (run > 1) text += std::to_string(run) + "x";
    for (char c : shape_str(graph.shape(ids[i])))
      if (c != ' ') text += c;
    if (graph.dtype(ids[i]) != DType::kF32)
      text += std::string(":") + dtype_name(graph.dtype(ids[i]));
    i += run;
  }
  return text.empty() ? "-" : text;
}

// Roots that an op reads or writes (directly or through a view), or that are graph results.
std::vector<bool> used_roots(const Graph& graph) {
  std::vector<bool> used(graph.values.size(), false);
  for (const auto& op : graph.ops) {
    for (ValueId id : op->inputs) used[root_of(graph, id)] = true;
    for (ValueId id : op->outputs) used[root_of(graph, id)] = true;
  }
  for (ValueId id : {graph.input, graph.output, graph.loss})
    if (id >= 0) used[root_of(graph, id)] = true;
  return used;
}

// A bf16 value counts 2 bytes an element; its gradient is fp32 (kFloatBytes) whatever its dtype.
double value_bytes(const Graph& graph, ValueId id) {
  return graph.element_bytes(id) * static_cast<double>(graph.numel(id));
}

PlanMemory train_memory(const Graph& graph) {
  PlanMemory memory;
  const std::vector<bool> used = used_roots(graph);
  for (ValueId id = 0; id < static_cast<ValueId>(graph.values.size()); ++id) {
    const Value& value = graph.values[id];
    if (value.is_view() || !used[id]) continue;
    memory.activation_bytes += value_bytes(graph, id);
    // As Executor::needs_grad: the input (images) and values marked so get no gradient buffer.
    if (value.needs_grad && id != graph.input)
      memory.gradient_bytes += kFloatBytes * static_cast<double>(graph.numel(id));
  }
  for (const auto& op : graph.ops) memory.saved_bytes += op->cost(graph).saved_bytes;
  memory.activation_bytes += memory.saved_bytes;
  memory.peak_bytes = memory.activation_bytes + memory.gradient_bytes;
  return memory;
}

// Liveness in op order: a root is allocated by the first op touching it (the graph input is
// live from the start) and freed after its last reader; graph results live to the end. Buffers
// an op owns (statistics, probabilities) stay allocated once the op has run.
PlanMemory eval_memory(const Graph& graph) {
  const int op_count = static_cast<int>(graph.ops.size());
  std::vector<int> first_use(graph.values.size(), op_count);
  std::vector<int> last_use(graph.values.size(), -1);
  for (int i = 0; i < op_count; ++i) {
    const Op& op = *graph.ops[i];
    for (const auto* ids : {&op.inputs, &op.outputs}) {
      for (ValueId id : *ids) {
        const ValueId root = root_of(graph, id);
        first_use[root] = std::min(first_use[root], i);
        last_use[root] = std::max(last_use[root], i);
      }
    }
  }
  for (ValueId id : {graph.input, graph.output, graph.loss}) {
    if (id < 0) continue;
    const ValueId root = root_of(graph, id);
    if (id == graph.input) first_use[root] = 0;
    if (id != graph.input) last_use[root] = op_count;
  }
  PlanMemory memory;
  double owned = 0;
  for (int i = 0; i < op_count; ++i) {
    owned += graph.ops[i]->cost(graph).saved_bytes;
    double live = owned;
    for (ValueId id = 0; id < static_cast<ValueId>(graph.values.size()); ++id)
      if (!graph.values[id].is_view() && first_use[id] <= i && i <= last_use[id])
        live += value_bytes(graph, id);
    memory.activation_bytes = std::max(memory.activation_bytes, live);
  }
  memory.saved_bytes = owned;
  memory.peak_bytes = memory.activation_bytes;
  return memory;
}

nlohmann::json plan_graph_json(const PlanGraph& graph) {
  nlohmann::json ops = nlohmann::json::array();
  for (const PlanOp& op : graph.ops) {
    ops.push_back({{"index", op.index},
                   {"name", op.name},
                   {"kind", op.kind},
                   {"shapes", op.shapes},
                   {"flops", op.flops},
                   {"forward_flops", op.cost.forward_flops},
                   {"backward_flops", op.cost.backward_flops},
                   {"bytes_read", op.cost.bytes_read},
                   {"bytes_written", op.cost.bytes_written},
                   {"saved_bytes", op.cost.saved_bytes},
                   {"intensity", op.intensity},
                   {"eager_ops", op.eager_ops}});
  }
  const PlanTotals& totals = graph.totals;
  const nlohmann::json memory = {{"activation_bytes", totals.memory.activation_bytes},
                                 {"saved_bytes", totals.memory.saved_bytes},
                                 {"gradient_bytes", totals.memory.gradient_bytes},
                                 {"peak_bytes", totals.memory.peak_bytes}};
  return {{"ops", ops},
          {"totals",
           {{"ops", totals.ops},
            {"eager_ops", totals.eager_ops},
            {"flops", totals.flops},
            {"bytes_moved", totals.bytes_moved},
            {"memory", memory}}}};
}

}  // namespace

PlanMemory plan_memory(const Graph& graph) {
  return graph.mode == GraphMode::kTrain ? train_memory(graph) : eval_memory(graph);
}

PlanGraph describe_plan_graph(const Graph& graph) {
  PlanGraph plan;
  const bool train = graph.mode == GraphMode::kTrain;
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    const Op& op = *graph.ops[i];
    PlanOp row;
    row.index = static_cast<int>(i);
    row.name = op.name;
    row.kind = op.kind();
    row.shapes = shape_list(graph, op.inputs) + " -> " + shape_list(graph, op.outputs);
    row.cost = op.cost(graph);
    row.flops = row.cost.forward_flops + (train ? row.cost.backward_flops : 0.0);
    const double bytes = row.cost.bytes_read + row.cost.bytes_written;
    row.intensity = bytes > 0 ? row.cost.forward_flops / bytes : 0.0;
    row.eager_ops = op.eager_ops;
    plan.totals.flops += row.flops;
    plan.totals.bytes_moved += bytes;
    plan.totals.eager_ops += static_cast<size_t>(op.eager_ops);
    plan.ops.push_back(std::move(row));
  }
  plan.totals.ops = plan.ops.size();
  plan.totals.memory = plan_memory(graph);
  return plan;
}

Plan build_plan(const std::function<Graph()>& build_eager, const ParamStore& params,
                const FusionOptions& options) {
  return build_plan(build_eager, params, options, FusionPipeline::standard());
}

Plan build_plan(const std::function<Graph()>& build_eager, const ParamStore& params,
                const FusionOptions& options, const FusionPipeline& passes) {
  Plan plan;
  const Graph eager = build_eager();
  plan.mode = eager.mode;
  plan.before = describe_plan_graph(eager);
  Graph fused = build_eager();
  FT_CHECK(fused.ops.size() == eager.ops.size() && fused.mode == eager.mode,
           "plan: the graph builder returned two different eager graphs");
  plan.fusion = passes.run(fused, params, options);
  plan.after = describe_plan_graph(fused);
  return plan;
}

std::string describe_decision(const FusionDecision& decision) {
  std::ostringstream out;
  out << decision.pass << (decision.fused ? " fused at " : " skipped at ") << decision.site << ": "
      << decision.reason;
  if (decision.fused) out << " (" << decision.ops_absorbed << " ops)";
  return out.str();
}

std::string plan_to_json(const Plan& plan, const std::string& config_path, int batch) {
  nlohmann::json passes = nlohmann::json::array();
  for (const PassReport& pass : plan.fusion.passes) {
    passes.push_back({{"pass", pass.pass},
                      {"enabled", pass.enabled},
                      {"rewrites", pass.rewrites},
                      {"ops_before", pass.ops_before},
                      {"ops_after", pass.ops_after}});
  }
  nlohmann::json decisions = nlohmann::json::array();
  for (const FusionDecision& decision : plan.fusion.decisions) {
    decisions.push_back({{"pass", decision.pass},
                         {"site", decision.site},
                         {"fused", decision.fused},
                         {"reason", decision.reason},
                         {"ops_absorbed", decision.ops_absorbed},
                         {"text", describe_decision(decision)}});
  }
  const nlohmann::json report = {{"type", "plan"},
                                 {"config", config_path},
                                 {"mode", graph_mode_name(plan.mode)},
                                 {"batch", batch},
                                 {"before", plan_graph_json(plan.before)},
                                 {"after", plan_graph_json(plan.after)},
                                 {"passes", passes},
                                 {"decisions", decisions}};
  return report.dump(2);
}

std::string binary_bytes_text(double bytes) {
  static const char* const kSuffixes[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int suffix = 0;
  while (bytes >= 1023.5 && suffix < 4) {
    bytes /= 1024.0;
    ++suffix;
  }
  char text[32];
  const char* format = suffix == 0 || bytes >= 100 ? "%.0f%s" : bytes >= 10 ? "%.1f%s" : "%.2f%s";
  std::snprintf(text, sizeof(text), format, bytes, kSuffixes[suffix]);
  return text;
}

}  // namespace ft

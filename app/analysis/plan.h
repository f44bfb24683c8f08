// What `fusiontrain plan` reports: the op list of a graph before and after the fusion passes
// (shapes, FLOPs, bytes, arithmetic intensity), every pass and every decision it made, and the
// totals (op count, FLOPs, bytes moved, peak activation memory). Building the report is pure
// (graphs in, structs out) so tests check it without the binary; app/jobs/plan_job.cpp prints it.
// Thread safety: pure functions; the caller owns the graphs and the parameter store.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "fusion/pipeline.h"
#include "model/graph.h"
#include "model/params.h"

namespace ft {

// One op of a graph, as a row of the op table.
struct PlanOp {
  int index = 0;
  std::string name;
  std::string kind;
  std::string shapes;  // "[256,128] [128] -> [256,384]": inputs -> outputs
  OpCost cost;
  double flops = 0;      // forward + backward for a train graph, forward for an eval graph
  double intensity = 0;  // forward FLOPs per forward byte read or written (0 without bytes)
  int eager_ops = 1;     // ops of the eager graph this op stands for
};

// Bytes of activation memory a graph needs at its peak.
// Train graphs keep every activation until backward: activations = every root value (views add
// nothing) + every op's saved_bytes, gradients = a buffer per root value that needs one, and
// peak = activations + gradients. Eval graphs free a root after its last reader: peak is the
// largest live set in op order (op-owned saved buffers count from their op on); gradients 0.
struct PlanMemory {
  double activation_bytes = 0;  // train: roots + saved; eval: the peak live set
  double saved_bytes = 0;       // part of activation_bytes kept by ops for backward
  double gradient_bytes = 0;
  double peak_bytes = 0;
};

struct PlanTotals {
  size_t ops = 0;
  size_t eager_ops = 0;    // sum of eager_ops: equals the eager op count when passes are sound
  double flops = 0;        // sum of PlanOp::flops
  double bytes_moved = 0;  // sum over ops of bytes read + bytes written (forward)
  PlanMemory memory;
};

struct PlanGraph {
  std::vector<PlanOp> ops;
  PlanTotals totals;
};

struct Plan {
  GraphMode mode = GraphMode::kTrain;
  PlanGraph before;  // the eager graph as model/ built it
  PlanGraph after;   // after FusionPipeline::standard()
  FusionResult fusion;
};

// The op table and totals of `graph` (its mode picks the FLOP and memory rules above).
PlanGraph describe_plan_graph(const Graph& graph);
PlanMemory plan_memory(const Graph& graph);

// Builds the eager graph twice (build_eager must return equal graphs), describes the first,
// runs the standard pipeline with `options` on the second and describes the result.
Plan build_plan(const std::function<Graph()>& build_eager, const ParamStore& params,
                const FusionOptions& options);
// The same with `passes` in place of the standard pipeline (a test's, with a pass of its own).
Plan build_plan(const std::function<Graph()>& build_eager, const ParamStore& params,
                const FusionOptions& options, const FusionPipeline& passes);

// One decision as `plan` prints it: "gemm_epilogue fused at h.1.mlp.c_fc: linear+gelu (2 ops)"
// or "conv_shortcut skipped at layer2.0.conv1: padding overhead 0.80 > 0.25".
std::string describe_decision(const FusionDecision& decision);

// Bytes in binary units with three significant digits: "512B", "1.50MiB", "46.5MiB", "128KiB";
// what plan's and bench's tables print.
std::string binary_bytes_text(double bytes);

// The whole plan as JSON text (what --json writes).
std::string plan_to_json(const Plan& plan, const std::string& config_path, int batch);

}  // namespace ft

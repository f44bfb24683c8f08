// `fusiontrain plan`: builds the eager graph of a config, runs the fusion passes on a copy, and
// prints both op tables, every pass and decision, and the totals (app/analysis/plan.h builds the
// report). Tables fit 120 columns; long names and shape lists are cut with a '~'.
#include <omp.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "app/analysis/plan.h"
#include "app/cli/flag_checks.h"
#include "app/config/config.h"
#include "app/jobs/jobs.h"
#include "app/training/task.h"
#include "core/atomic_file.h"
#include "core/check.h"

namespace ft {
namespace {

// Keeps `text` within `width` characters, marking a cut with '~'.
std::string fit(const std::string& text, size_t width) {
  if (text.size() <= width) return text;
  return text.substr(0, width - 1) + "~";
}

// 1234567 -> "1.23M": three significant digits with an SI suffix.
std::string si(double amount, const char* unit = "") {
  static const char* const kSuffixes[] = {"", "K", "M", "G", "T", "P"};
  int suffix = 0;
  while (amount >= 999.5 && suffix < 5) {
    amount /= 1000.0;
    ++suffix;
  }
  char text[32];
  if (suffix == 0)
    std::snprintf(text, sizeof(text), "%.0f%s", amount, unit);
  else
    std::snprintf(text, sizeof(text), "%.3g%s%s", amount, kSuffixes[suffix], unit);
  return text;
}

void print_op_table(const char* title, const PlanGraph& graph, GraphMode mode) {
  std::printf("%s: %zu ops\n", title, graph.ops.size());
  std::printf("%3s %-21s %-18s %-36s %8s %8s %8s %5s %5s\n", "#", "name", "kind",
              "inputs -> outputs", mode == GraphMode::kTrain ? "FLOP f+b" : "FLOP", "read",
              "written", "AI", "eager");
  for (const PlanOp& op : graph.ops) {
    std::printf("%3d %-21s %-18s %-36s %8s %8s %8s %5.1f %5d\n", op.index, fit(op.name, 21).c_str(),
                fit(op.kind, 18).c_str(), fit(op.shapes, 36).c_str(), si(op.flops).c_str(),
                binary_bytes_text(op.cost.bytes_read).c_str(),
                binary_bytes_text(op.cost.bytes_written).c_str(), op.intensity, op.eager_ops);
  }
  std::printf("\n");
}

void print_passes(const FusionResult& fusion) {
  std::printf("passes:\n");
  for (const PassReport& pass : fusion.passes) {
    std::printf("  %-20s %-3s %3d rewrites, %zu -> %zu ops\n", pass.pass.c_str(),
                pass.enabled ? "on" : "off", pass.rewrites, pass.ops_before, pass.ops_after);
  }
  std::printf("\ndecisions: %zu\n", fusion.decisions.size());
  for (const FusionDecision& decision : fusion.decisions)
    std::printf("  %s\n", describe_decision(decision).c_str());
  std::printf("\n");
}

void print_totals(const Plan& plan) {
  const PlanTotals& before = plan.before.totals;
  const PlanTotals& after = plan.after.totals;
  const bool train = plan.mode == GraphMode::kTrain;
  auto row = [](const char* label, const std::string& eager, const std::string& fused,
                double eager_value, double fused_value) {
    const double change = eager_value > 0 ? 100.0 * (fused_value - eager_value) / eager_value : 0;
    std::printf("  %-30s %12s %12s %+8.1f%%\n", label, eager.c_str(), fused.c_str(), change);
  };
  std::printf("%-33s%12s %12s %9s\n", "totals:", "eager", "fused", "change");
  row("ops", std::to_string(before.ops), std::to_string(after.ops), static_cast<double>(before.ops),
      static_cast<double>(after.ops));
  row(train ? "FLOPs (forward + backward)" : "FLOPs", si(before.flops), si(after.flops),
      before.flops, after.flops);
  row("bytes moved (forward)", binary_bytes_text(before.bytes_moved),
      binary_bytes_text(after.bytes_moved), before.bytes_moved, after.bytes_moved);
  const PlanMemory& m0 = before.memory;
  const PlanMemory& m1 = after.memory;
  if (train) {
    row("activations (kept to backward)", binary_bytes_text(m0.activation_bytes),
        binary_bytes_text(m1.activation_bytes), m0.activation_bytes, m1.activation_bytes);
    row("  of which saved by ops", binary_bytes_text(m0.saved_bytes),
        binary_bytes_text(m1.saved_bytes), m0.saved_bytes, m1.saved_bytes);
    row("activation gradients", binary_bytes_text(m0.gradient_bytes),
        binary_bytes_text(m1.gradient_bytes), m0.gradient_bytes, m1.gradient_bytes);
    row("peak activation memory", binary_bytes_text(m0.peak_bytes),
        binary_bytes_text(m1.peak_bytes), m0.peak_bytes, m1.peak_bytes);
  } else {
    row("peak activation memory (live)", binary_bytes_text(m0.peak_bytes),
        binary_bytes_text(m1.peak_bytes), m0.peak_bytes, m1.peak_bytes);
  }
}

GraphMode parse_mode(const std::string& mode) {
  if (mode == "train") return GraphMode::kTrain;
  if (mode == "eval") return GraphMode::kEval;
  FT_USAGE_FAIL("--mode '", mode, "' is not one of: train, eval");
}

}  // namespace

int run_plan(const PlanArgs& args) {
  const GraphMode mode = parse_mode(args.mode);
  FT_USAGE_REQUIRE(!args.batch_given || args.batch >= 1, "--batch ", args.batch,
                   " must be a positive integer (default: train.batch_size)");
  if (args.batch_given) require_key_range("--batch", "train.batch_size", args.batch);
  const Config config = load_config(args.config_path, args.overrides);
  const int batch = args.batch_given ? args.batch : config.train.batch_size;
  omp_set_num_threads(resolve_threads(config.train.threads));
  std::unique_ptr<Task> task = make_task(config, 0, 1);
  // Shapes only: plan describes the model without allocating it (a large one would not fit).
  ParamStore params;
  task->register_params(params);
  const Plan plan =
      build_plan([&] { return task->build_graph(batch, mode); }, params, config.fusion);

  std::printf("plan: %s (%s, %s graph, batch %d, precision %s, fusion %s)\n\n",
              args.config_path.c_str(), config.model.arch.c_str(), graph_mode_name(mode), batch,
              config.train.precision.c_str(), config.fusion.enabled ? "on" : "off");
  std::printf(
      "FLOP%s; read, written: forward bytes;\nAI: forward FLOPs per byte; eager: eager "
      "ops the op stands for\n\n",
      mode == GraphMode::kTrain ? " f+b: forward + backward" : ": forward");
  print_op_table("eager graph", plan.before, mode);
  print_op_table("fused graph", plan.after, mode);
  print_passes(plan.fusion);
  print_totals(plan);
  if (!args.json_path.empty()) {
    write_output_file(args.json_path, plan_to_json(plan, args.config_path, batch) + "\n");
  }
  return 0;
}

}  // namespace ft

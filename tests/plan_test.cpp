// `plan`: the report builder on a tiny GPT (fusion off leaves the graph alone, totals are sums
// over ops, eval needs less memory than train), the memory model on a hand-built chain, and the
// CLI's errors and JSON.
#include "app/analysis/plan.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "app/config/config.h"
#include "app/training/task.h"
#include "model/ops/gelu.h"
#include "run_command.h"

namespace ft {
namespace {

std::string source_path(const std::string& relative) {
  return std::string(FT_SOURCE_DIR) + "/" + relative;
}

Config tiny_gpt_config(const std::vector<std::string>& overrides) {
  const std::string yaml =
      "model:\n  arch: gpt\n  n_layer: 1\n  n_head: 2\n  d_model: 16\n  seq_len: 8\n"
      "train:\n  batch_size: 2\n  threads: 1\n"
      "data:\n  path: " +
      source_path("data/moby_dick.txt") + "\n";
  return parse_config(yaml, "tiny_gpt.yaml", overrides);
}

Plan plan_for(const Config& config, GraphMode mode) {
  std::unique_ptr<Task> task = make_task(config, 0, 1);
  ParamStore params;
  task->register_params(params);
  params.allocate();
  params.initialize(config.train.seed);
  return build_plan([&] { return task->build_graph(config.train.batch_size, mode); }, params,
                    config.fusion);
}

TEST(Plan, FusionOffLeavesTheEagerGraph) {
  const Plan plan = plan_for(tiny_gpt_config({"fusion.enabled=false"}), GraphMode::kTrain);
  ASSERT_GT(plan.before.totals.ops, 0u);
  EXPECT_EQ(plan.after.totals.ops, plan.before.totals.ops);
  ASSERT_EQ(plan.after.ops.size(), plan.before.ops.size());
  for (size_t i = 0; i < plan.before.ops.size(); ++i) {
    EXPECT_EQ(plan.after.ops[i].name, plan.before.ops[i].name);
    EXPECT_EQ(plan.after.ops[i].kind, plan.before.ops[i].kind);
  }
  for (const FusionDecision& decision : plan.fusion.decisions)
    EXPECT_FALSE(decision.fused) << describe_decision(decision);
  for (const PassReport& pass : plan.fusion.passes) {
    EXPECT_FALSE(pass.enabled) << pass.pass;
    EXPECT_EQ(pass.rewrites, 0) << pass.pass;
  }
  EXPECT_DOUBLE_EQ(plan.after.totals.flops, plan.before.totals.flops);
  EXPECT_DOUBLE_EQ(plan.after.totals.memory.peak_bytes, plan.before.totals.memory.peak_bytes);
}

TEST(Plan, TotalsAreSumsOverOps) {
  for (GraphMode mode : {GraphMode::kTrain, GraphMode::kEval}) {
    const Plan plan = plan_for(tiny_gpt_config({}), mode);
    for (const PlanGraph* graph : {&plan.before, &plan.after}) {
      double flops = 0, forward_flops = 0, bytes = 0;
      size_t eager_ops = 0;
      for (const PlanOp& op : graph->ops) {
        flops += op.flops;
        forward_flops += op.cost.forward_flops;
        bytes += op.cost.bytes_read + op.cost.bytes_written;
        eager_ops += static_cast<size_t>(op.eager_ops);
      }
      EXPECT_GT(flops, 0);
      EXPECT_DOUBLE_EQ(graph->totals.flops, flops);
      EXPECT_DOUBLE_EQ(graph->totals.bytes_moved, bytes);
      EXPECT_EQ(graph->totals.ops, graph->ops.size());
      // Every eager op is accounted for exactly once, fused or not.
      EXPECT_EQ(eager_ops, plan.before.totals.ops);
      if (mode == GraphMode::kTrain)
        EXPECT_GT(flops, forward_flops);  // backward counted
      else
        EXPECT_DOUBLE_EQ(flops, forward_flops);
    }
  }
}

TEST(Plan, EvalPeakMemoryIsBelowTrain) {
  const Config config = tiny_gpt_config({"fusion.enabled=false"});
  const Plan train = plan_for(config, GraphMode::kTrain);
  const Plan eval = plan_for(config, GraphMode::kEval);
  EXPECT_GT(train.before.totals.memory.gradient_bytes, 0);
  EXPECT_EQ(eval.before.totals.memory.gradient_bytes, 0);
  EXPECT_GT(eval.before.totals.memory.peak_bytes, 0);
  EXPECT_LT(eval.before.totals.memory.peak_bytes, train.before.totals.memory.peak_bytes);
}

// x -> gelu -> y -> gelu -> z -> gelu -> w, n floats each: training keeps all four roots and a
// gradient for all but the input; evaluation never holds more than two at once.
Graph gelu_chain(GraphMode mode, int64_t n) {
  Graph graph;
  graph.mode = mode;
  ValueId previous = graph.input = graph.add_value("x", {n});
  for (const char* name : {"y", "z", "w"}) {
    const ValueId next = graph.add_value(name, {n});
    graph.add_op<GeluOp>(std::string("gelu_") + name, {previous}, {next}, {}, n);
    previous = next;
  }
  graph.output = previous;
  return graph;
}

TEST(Plan, MemoryModelOnAChain) {
  const int64_t n = 100;
  const PlanMemory train = plan_memory(gelu_chain(GraphMode::kTrain, n));
  EXPECT_DOUBLE_EQ(train.activation_bytes, 4.0 * 4 * n);
  EXPECT_DOUBLE_EQ(train.gradient_bytes, 3.0 * 4 * n);
  EXPECT_DOUBLE_EQ(train.peak_bytes, 7.0 * 4 * n);
  const PlanMemory eval = plan_memory(gelu_chain(GraphMode::kEval, n));
  EXPECT_DOUBLE_EQ(eval.peak_bytes, 2.0 * 4 * n);
  EXPECT_DOUBLE_EQ(eval.gradient_bytes, 0);
}

TEST(Plan, DecisionText) {
  EXPECT_EQ(describe_decision({"gemm_epilogue", "h.1.mlp.c_fc", true, "linear+gelu", 2}),
            "gemm_epilogue fused at h.1.mlp.c_fc: linear+gelu (2 ops)");
  EXPECT_EQ(describe_decision(
                {"conv_shortcut", "layer2.0.conv1", false, "padding overhead 0.80 > 0.25", 0}),
            "conv_shortcut skipped at layer2.0.conv1: padding overhead 0.80 > 0.25");
}

using test::RunResult;

RunResult run_binary(const std::string& args) {
  return test::run_fusiontrain(args, 120, "env OMP_NUM_THREADS=1 ");
}

void expect_error(const RunResult& result, const std::string& needle) {
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_LT(result.exit_code, 124) << "timed out or crashed: " << result.output;
  EXPECT_NE(result.output.find(needle), std::string::npos)
      << "expected '" << needle << "' in: " << result.output;
}

TEST(PlanCli, BadModeAndBatchNameTheFlagAndAllowedValues) {
  expect_error(run_binary("plan --mode bogus"), "--mode 'bogus' is not one of: train, eval");
  expect_error(run_binary("plan --batch 0"), "--batch 0 must be a positive integer");
}

TEST(PlanCli, WritesTheReportAsJson) {
  const std::string json_path = ::testing::TempDir() + "/plan.json";
  const RunResult result = run_binary(
      "plan --config configs/gpt_tiny.yaml --set model.n_layer=1 --set train.threads=1 --mode "
      "eval --batch 2 --json " +
      json_path);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("eager graph:"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("peak activation memory"), std::string::npos) << result.output;
  std::ifstream file(json_path);
  std::stringstream text;
  text << file.rdbuf();
  const nlohmann::json report = nlohmann::json::parse(text.str());
  EXPECT_EQ(report.at("mode"), "eval");
  EXPECT_EQ(report.at("batch"), 2);
  EXPECT_EQ(report.at("before").at("ops").size(),
            report.at("before").at("totals").at("ops").get<size_t>());
  EXPECT_FALSE(report.at("passes").empty());
}

}  // namespace
}  // namespace ft

namespace ft {
namespace {

// plan describes a model without allocating it: a 10-billion-parameter GPT (about 40 GiB of
// parameters) is planned inside a 4 GB address-space limit. It once allocated its parameters
// (48 GiB for a larger one) and failed advising to reduce bench sizes.
TEST(PlanCli, DescribesAModelLargerThanMemoryWithoutAllocatingIt) {
  const test::RunResult result = test::run_shell(
      std::string("cd ") + FT_SOURCE_DIR + " && ulimit -v 4000000 && " + FT_BINARY +
      " plan --set model.n_layer=48 --set model.d_model=4096 --set model.n_head=32 --set "
      "model.seq_len=1024 --set train.batch_size=1 2>&1");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("peak activation memory"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace ft

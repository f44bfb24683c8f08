// `fusiontrain bench`, the binary on a one-layer GPT: every default variant runs interleaved, the
// final losses agree within the stated tolerance, the JSON has every column, --sweep makes one
// variant per value, --trace has one process per variant, and bad input (a flag, a variant that
// changes the work, train.trace) fails naming the flag and the allowed values; under mpirun the
// table shows each comm.grad_dtype's reduced bytes; a diverging bench says it writes no
// checkpoints. The variant expansion and statistics are in bench_test.cpp.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "app/analysis/bench.h"
#include "run_command.h"

namespace ft {
namespace {

const std::vector<std::string> kDefaultNames = {"unfused",   "horizontal", "vertical",
                                                "bucketing", "overlap",    "all"};

using test::RunResult;

RunResult run(const std::string& args) {
  return test::run_fusiontrain(args, 300);
}

const std::string kTiny =
    "bench --config configs/gpt_tiny.yaml --set model.n_layer=1 --set model.d_model=16 "
    "--set model.n_head=2 --set train.batch_size=2 --set train.threads=1 --steps 3 --warmup 1 ";

nlohmann::json read_json(const std::string& path) {
  std::ifstream file(path);
  return nlohmann::json::parse(file);  // throws on malformed JSON
}

TEST(BenchBinary, DefaultVariantsRunInterleavedAndAgree) {
  const std::string json_path = ::testing::TempDir() + "/bench_default.json";
  std::remove(json_path.c_str());
  const RunResult result = run(kTiny + "--json " + json_path);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("ETA"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("tolerance: relative 1e-03"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("| launches/step |"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("warning: only 3 timed round(s)"), std::string::npos)
      << result.output;
  for (const std::string& name : kDefaultNames)
    EXPECT_NE(result.output.find("| " + name + " |"), std::string::npos) << result.output;

  const nlohmann::json json = read_json(json_path);
  EXPECT_EQ(json["rounds"], 3);
  EXPECT_EQ(json["warmup"], 1);
  EXPECT_EQ(json["baseline"], "unfused");
  EXPECT_DOUBLE_EQ(json["loss_tolerance"]["relative"].get<double>(), kBenchLossTolerance);
  ASSERT_EQ(json["order"].size(), 3u);
  for (const nlohmann::json& round : json["order"])
    EXPECT_EQ(round.get<std::vector<std::string>>(), kDefaultNames);
  ASSERT_EQ(json["variants"].size(), kDefaultNames.size());
  const double unfused_loss = json["variants"][0]["final_loss"].get<double>();
  for (size_t v = 0; v < kDefaultNames.size(); ++v) {
    const nlohmann::json& variant = json["variants"][v];
    EXPECT_EQ(variant["variant"], kDefaultNames[v]);
    for (const char* column : {"median_ms",
                               "p10_ms",
                               "p90_ms",
                               "speedup",
                               "speedup_p10",
                               "speedup_p90",
                               "within_noise",
                               "compute_ms",
                               "comm_ms",
                               "exposed_comm_ms",
                               "ops_per_step",
                               "allreduces_per_step",
                               "bytes_reduced_per_step",
                               "bytes_moved",
                               "peak_activation_bytes",
                               "final_loss",
                               "loss_tolerance",
                               "loss_ok",
                               "step_ms",
                               "launches",
                               "gemm_ms"})
      EXPECT_TRUE(variant.contains(column)) << kDefaultNames[v] << " lacks " << column;
    EXPECT_TRUE(variant["launches"].is_null()) << "cpu counts no launches";
    const bool comm_only = kDefaultNames[v] == "bucketing" || kDefaultNames[v] == "overlap";
    EXPECT_EQ(variant["note"], comm_only ? "no communication on 1 rank" : "") << kDefaultNames[v];
    EXPECT_EQ(variant["step_ms"].size(), 3u);
    EXPECT_GT(variant["median_ms"].get<double>(), 0.0);
    EXPECT_GT(variant["gemm_ms"].get<double>(), 0.0) << "the cpu GEMMs were not timed";
    EXPECT_GT(variant["ops_per_step"].get<int>(), 0);
    EXPECT_GT(variant["peak_activation_bytes"].get<double>(), 0.0);
    EXPECT_TRUE(variant["loss_ok"].get<bool>());
    EXPECT_NEAR(variant["final_loss"].get<double>(), unfused_loss,
                kBenchLossTolerance * unfused_loss);
  }
  // Every variant is profiled: its top ops name ops of its own executed graph, with shares.
  for (size_t v = 0; v < kDefaultNames.size(); ++v) {
    const nlohmann::json& profile = json["variants"][v]["profile"];
    ASSERT_TRUE(profile.contains("top_ops") && profile.contains("advice")) << kDefaultNames[v];
    ASSERT_FALSE(profile["top_ops"].empty()) << kDefaultNames[v];
    double share = 0;
    for (const nlohmann::json& op : profile["top_ops"]) {
      EXPECT_GE(op["forward_ms"].get<double>() + op["backward_ms"].get<double>(), 0.0);
      share += op["share"].get<double>();
    }
    EXPECT_GT(share, 0.0);
    EXPECT_LE(share, 1.05);
  }
  EXPECT_NE(result.output.find("top 5 ops of all"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("top 5 ops of unfused"), std::string::npos) << result.output;
  // The fused classifier exists only in the fused graph's profile.
  const auto has_kind = [&](size_t v, const std::string& kind) {
    for (const nlohmann::json& op : json["variants"][v]["profile"]["top_ops"])
      if (op["kind"] == kind) return true;
    return false;
  };
  EXPECT_TRUE(has_kind(0, "cross_entropy"));
  EXPECT_FALSE(has_kind(0, "classifier"));
  EXPECT_TRUE(has_kind(5, "classifier"));
  // Fusion shrinks the executed graph; unfused runs the eager one.
  EXPECT_LT(json["variants"][5]["ops_per_step"].get<int>(),
            json["variants"][0]["ops_per_step"].get<int>());
}

TEST(BenchBinary, SweepRunsOneVariantPerValue) {
  const std::string json_path = ::testing::TempDir() + "/bench_sweep.json";
  const RunResult result = run(kTiny + "--sweep fusion.max_ops=1,4 --json " + json_path);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const nlohmann::json json = read_json(json_path);
  ASSERT_EQ(json["variants"].size(), 2u);
  EXPECT_EQ(json["variants"][0]["variant"], "fusion.max_ops=1");
  EXPECT_EQ(json["variants"][1]["variant"], "fusion.max_ops=4");
  EXPECT_EQ(json["baseline"], "fusion.max_ops=1");
  // max_ops 1 fuses nothing.
  EXPECT_GT(json["variants"][0]["ops_per_step"].get<int>(),
            json["variants"][1]["ops_per_step"].get<int>());
}

// Under mpirun the table and the JSON say how many gradient bytes each step reduced: every
// trainable float once, in comm.grad_dtype, so bf16 moves half of fp32's (one rank reduces
// nothing and shows "-", bench_test.cpp).
TEST(BenchBinary, TwoRanksShowTheGradientBytesOfEachGradDtype) {
  if (test::run_shell("command -v mpirun").exit_code != 0) GTEST_SKIP() << "no mpirun";
  const std::string json_path = ::testing::TempDir() + "/bench_grad_dtype.json";
  std::remove(json_path.c_str());
  const RunResult result = test::run_fusiontrain(
      kTiny +
          "--set train.precision=bf16 --variants "
          "\"grad_fp32:comm.grad_dtype=fp32,grad_bf16:comm.grad_dtype=bf16\" --json " +
          json_path,
      300,
      "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np "
      "2 ");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("| allreduces | reduced/step |"), std::string::npos)
      << result.output;
  const nlohmann::json json = read_json(json_path);
  ASSERT_EQ(json["variants"].size(), 2u);
  const double fp32 = json["variants"][0]["bytes_reduced_per_step"].get<double>();
  const double bf16 = json["variants"][1]["bytes_reduced_per_step"].get<double>();
  EXPECT_GT(fp32, 0);
  EXPECT_EQ(static_cast<int64_t>(fp32) % 4, 0) << fp32;
  EXPECT_DOUBLE_EQ(bf16, fp32 / 2);
}

TEST(BenchBinary, TraceHasOneProcessPerVariantWithTheirOps) {
  const std::string trace_path = ::testing::TempDir() + "/bench_trace.json";
  std::remove(trace_path.c_str());
  const RunResult result = run(kTiny + "--variants unfused,all --trace " + trace_path);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const nlohmann::json trace = read_json(trace_path);
  ASSERT_TRUE(trace.contains("traceEvents"));
  std::map<int, std::string> process_names;
  std::map<int, int> compute_slices, step_slices;
  for (const nlohmann::json& event : trace["traceEvents"]) {
    const int pid = event["pid"].get<int>();
    if (event["ph"] == "M" && event["name"] == "process_name")
      process_names[pid] = event["args"]["name"].get<std::string>();
    if (event["ph"] != "X") continue;
    EXPECT_GE(event["dur"].get<double>(), 0.0);
    if (event["tid"] == 1) ++compute_slices[pid];
    if (event["tid"] == 0) ++step_slices[pid];
  }
  EXPECT_EQ(process_names, (std::map<int, std::string>{{0, "unfused rank 0"}, {1, "all rank 0"}}));
  // 3 traced rounds; the fused graph runs fewer ops per step.
  EXPECT_EQ(step_slices[0], 3);
  EXPECT_EQ(step_slices[1], 3);
  EXPECT_GT(compute_slices[0], compute_slices[1]);
  EXPECT_GT(compute_slices[1], 0);
}

TEST(BenchBinary, ALossThatDiffersIsAMismatchAndFails) {
  const RunResult result = run(kTiny + "--variants unfused,hot:optim.lr=0.05");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("LOSS MISMATCH"), std::string::npos) << result.output;
}

TEST(BenchBinary, BadInputNamesTheFlagAndTheAllowedValues) {
  RunResult result = run(kTiny + "--variants unfused,turbo");
  EXPECT_EQ(result.exit_code, 2) << result.output;  // a usage error
  EXPECT_NE(result.output.find("--variants: unknown variant 'turbo'; allowed: unfused, horizontal"),
            std::string::npos)
      << result.output;
  result = run(kTiny + "--variants unfused,cuda_graph");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("--variants: variant 'cuda_graph': configs/gpt_tiny.yaml: invalid "
                               "config: fusion.cuda_graph = true"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("requires train.device = cuda"), std::string::npos) << result.output;
  result = run(kTiny + "--peak-tflops -1");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--peak-tflops: expected 0 (off) or a number in [0.001, 1e+06]"),
            std::string::npos)
      << result.output;
  result = run(kTiny + "--sweep fusion.max_ops");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--sweep 'fusion.max_ops': expected key=v1,v2"), std::string::npos)
      << result.output;
  result = run(kTiny + "--sweep fusion.max_opz=1,2");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("unknown key 'fusion.max_opz'"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace ft

namespace ft {
namespace {

// Variants must do the same work per step (a smaller batch once read "x 4.373x"), and bench
// writes no train.trace (it would time the tracing too): both are usage errors naming the key.
TEST(BenchBinary, VariantsThatChangeTheWorkOrTraceAreRefused) {
  const std::string tiny =
      "bench --config configs/gpt_tiny.yaml --set model.n_layer=1 --set model.d_model=16 "
      "--set model.n_head=2 --set train.batch_size=4 --steps 1 --warmup 1 ";
  const struct {
    std::string args, expected;
  } cases[] = {
      {"--variants unfused,x:train.batch_size=2",
       "variant 'x' sets train.batch_size = 2 where 'unfused' has 4"},
      {"--variants unfused,deep:model.n_layer=2", "variant 'deep' sets model.n_layer = 2"},
      {"--variants unfused,acc:train.grad_accum=2", "sets train.grad_accum = 2"},
      {"--sweep model.seq_len=16,32", "--sweep: variant 'model.seq_len=32' sets model.seq_len"},
      {"--variants unfused,t:train.trace=/tmp/never.json", "sets train.trace"},
      {"--variants unfused --set train.trace=/tmp/never.json", "use bench --trace FILE"},
  };
  for (const auto& c : cases) {
    const test::RunResult result = test::run_fusiontrain(tiny + c.args, 60);
    EXPECT_EQ(result.exit_code, 2) << c.args << ": " << result.output;
    EXPECT_NE(result.output.find(c.expected), std::string::npos) << c.args << ": " << result.output;
  }
}

// The convolution algorithm is not work (every value computes the same convolutions), so
// variants may compare them.
TEST(BenchBinary, ConvAlgorithmVariantsCompare) {
  const test::RunResult result = test::run_fusiontrain(
      "bench --config configs/resnet8.yaml --set model.resnet_width=16 --set train.batch_size=4 "
      "--steps 1 --warmup 1 --variants auto:model.conv_algorithm=auto,"
      "measure:model.conv_algorithm=measure,onednn:model.conv_algorithm=onednn",
      120);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (const char* variant : {"auto", "measure", "onednn"})
    EXPECT_NE(result.output.find(std::string("\n| ") + variant + " |"), std::string::npos)
        << variant << ": " << result.output;
}

}  // namespace
}  // namespace ft

namespace ft {
namespace {

// A diverging bench stops with the step and says it writes no checkpoints, instead of "no
// checkpoint written yet" (which suggests one will be).
TEST(BenchBinary, DivergenceSaysBenchWritesNoCheckpoints) {
  const test::RunResult result = test::run_fusiontrain(
      "bench --config configs/gpt_tiny.yaml --variants unfused --steps 20 --warmup 5 "
      "--set optim.lr=10 --set optim.grad_clip=0 --set optim.name=sgd",
      120);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("stopping the run"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("this job measures steps and writes no checkpoints"),
            std::string::npos)
      << result.output;
  EXPECT_EQ(result.output.find("no checkpoint written yet"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace ft

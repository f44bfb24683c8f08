// scripts/plot.py on small sample JSON of every job it plots: each kind, given or detected,
// writes a PNG; a missing file, bad JSON and JSON of the wrong job exit non-zero with a message.
// Skipped, with the reason, where no python3 on this machine can import matplotlib.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "run_command.h"

namespace {

using ft::test::run_shell;
using ft::test::RunResult;

// The first interpreter that has matplotlib: `python3` on PATH may be a pyenv or venv one
// without Debian's python3-matplotlib, which bootstrap.sh installs for /usr/bin/python3.
std::string python_with_matplotlib() {
  for (const char* python : {"python3", "/usr/bin/python3"}) {
    const std::string probe = std::string(python) + " -c 'import matplotlib' >/dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) return python;
  }
  return "";
}

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/plot_" + name;
  std::ofstream(path) << text;
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

const char kBench[] = R"({"config": "configs/gpt_tiny.yaml", "world_size": 2, "rounds": 3,
  "baseline": "unfused", "order": ["unfused", "all"], "variants": [
  {"variant": "unfused", "median_ms": 40, "p10_ms": 35, "p90_ms": 50, "speedup": 1.0,
   "within_noise": false, "compute_ms": 25, "comm_ms": 12, "exposed_comm_ms": 10},
  {"variant": "all", "median_ms": 30, "p10_ms": 28, "p90_ms": 33, "speedup": 1.33,
   "within_noise": false, "compute_ms": 22, "comm_ms": 6, "exposed_comm_ms": 1}]})";

const char kSweep[] = R"({"config": "configs/gpt_tiny.yaml", "world_size": 2, "rounds": 3,
  "variants": [
  {"variant": "comm.bucket_mb=0.25", "median_ms": 24, "p10_ms": 19, "p90_ms": 29,
   "compute_ms": 21, "exposed_comm_ms": 0.4},
  {"variant": "comm.bucket_mb=4", "median_ms": 19, "p10_ms": 18, "p90_ms": 20,
   "compute_ms": 18, "exposed_comm_ms": 0.2},
  {"variant": "comm.bucket_mb=16", "median_ms": 18, "p10_ms": 17, "p90_ms": 19,
   "compute_ms": 18, "exposed_comm_ms": 0.2}]})";

const char kBandwidth[] = R"({"job": "bandwidth", "backend": "mpi", "ranks": 2, "peak_gbps": 6,
  "sweep": [{"bytes": 4096, "utilization": 0.2}, {"bytes": 8192, "utilization": 0.25},
            {"bytes": 16384, "utilization": 0.4}],
  "fused": [{"message_bytes": 1048576, "messages": 4, "separate_utilization": 0.8,
             "fused_utilization": 0.9}]})";

const char kTrain[] =
    "{\"type\": \"step\", \"step\": 1, \"loss\": 5.5}\n"
    "{\"type\": \"step\", \"step\": 2, \"loss\": 5.0}\n"
    "{\"type\": \"eval\", \"step\": 2, \"loss\": 4.9}\n"
    "{\"type\": \"step\", \"step\": 3, \"loss\": 4.5}\n"
    "{\"type\": \"summary\", \"steps\": 3, \"ms_per_step\": 20.5, \"world_size\": 1}\n";

const char kSimulate[] = R"({"link": {"name": "ib400", "alpha_us": 5, "beta_gbytes_per_s": 40},
  "compute_scale": 1, "predictions": [
  {"ranks": 8, "bucketing": true, "overlap": true, "iteration_ms": 20, "efficiency": 0.95},
  {"ranks": 64, "bucketing": true, "overlap": true, "iteration_ms": 22, "efficiency": 0.9},
  {"ranks": 8, "bucketing": false, "overlap": false, "iteration_ms": 30, "efficiency": 0.6},
  {"ranks": 64, "bucketing": false, "overlap": false, "iteration_ms": 40, "efficiency": 0.45}]})";

// The shape `tune --json` writes: the winner is its overrides and median, matched to a point.
const char kTune[] = R"({"config": "configs/gpt_tiny.yaml", "points": [
  {"stage": "profile", "name": "unfused", "overrides": [], "median_ms": 20, "p10_ms": 19,
   "p90_ms": 22, "kept": true},
  {"stage": "passes", "name": "+gemm_epilogue", "overrides": ["fusion.vertical.gemm_epilogue=true"],
   "median_ms": 18, "p10_ms": 17, "p90_ms": 19, "kept": true},
  {"stage": "max_ops", "name": "max_ops=3", "overrides": ["fusion.max_ops=3"], "median_ms": 19,
   "p10_ms": 18, "p90_ms": 21, "kept": false}],
  "winner": {"overrides": ["fusion.vertical.gemm_epilogue=true"], "median_ms": 18}})";

class PlotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    python_ = python_with_matplotlib();
    if (python_.empty())
      GTEST_SKIP() << "no python3 here imports matplotlib; scripts/bootstrap.sh installs "
                      "python3-matplotlib";
  }

  RunResult plot(const std::string& args) const {
    return run_shell(std::string("cd ") + FT_SOURCE_DIR + " && timeout 120 " + python_ +
                     " scripts/plot.py " + args);
  }

  // Plots `json` once with its kind given and once detected; both must write a PNG.
  void expect_png(const std::string& kind, const std::string& json, const std::string& ext) {
    const std::string input = temp_file(kind + "." + ext, json);
    for (const std::string& given : {kind + " ", std::string()}) {
      const std::string output = ::testing::TempDir() + "/plot_" + kind + "_out.png";
      std::remove(output.c_str());
      const RunResult result = plot(given + input + " -o " + output);
      ASSERT_EQ(result.exit_code, 0) << "kind '" << given << "': " << result.output;
      EXPECT_NE(result.output.find(kind + " -> "), std::string::npos) << result.output;
      const std::string png = read_file(output);
      ASSERT_GT(png.size(), 1000u) << output;
      EXPECT_EQ(png.substr(1, 3), "PNG") << output;
    }
  }

  void expect_error(const std::string& args, const std::string& needle) const {
    const RunResult result = plot(args);
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_LT(result.exit_code, 124) << "timed out or crashed: " << result.output;
    EXPECT_NE(result.output.find(needle), std::string::npos)
        << "expected '" << needle << "' in: " << result.output;
    EXPECT_EQ(result.output.find("Traceback"), std::string::npos) << result.output;
  }

  std::string python_;
};

TEST_F(PlotTest, BenchVariantsStacked) {
  expect_png("bench", kBench, "json");
}
TEST_F(PlotTest, SweepOfBucketSize) {
  expect_png("sweep", kSweep, "json");
}
TEST_F(PlotTest, BandwidthSeparateAgainstFused) {
  expect_png("bandwidth", kBandwidth, "json");
}
TEST_F(PlotTest, TrainJsonLines) {
  expect_png("train", kTrain, "jsonl");
}
TEST_F(PlotTest, SimulateScaling) {
  expect_png("simulate", kSimulate, "json");
}
TEST_F(PlotTest, TunePoints) {
  expect_png("tune", kTune, "json");
}

TEST_F(PlotTest, MissingFileIsAnError) {
  expect_error("bench /nonexistent/bench.json", "/nonexistent/bench.json: no such file");
}

TEST_F(PlotTest, BadJsonIsAnError) {
  expect_error(temp_file("broken.json", "{\"variants\": [\n"), "not JSON");
  expect_error(temp_file("empty.json", ""), "empty");
}

TEST_F(PlotTest, WrongJobIsAnError) {
  const std::string train = temp_file("train_as_bench.jsonl", kTrain);
  expect_error("bench " + train, "missing key 'variants'");
  expect_error(temp_file("unknown.json", "{\"answer\": 42}"), "cannot tell which");
  expect_error("simulate " + temp_file("bench_as_sim.json", kBench), "missing key 'predictions'");
  expect_error("nonsense " + train, "KIND one of");
}

// JSON of a job plot.py does not plot, such as `infer --json`, is named for what it is.
TEST_F(PlotTest, JsonOfAnotherJobIsNamed) {
  const std::string infer = temp_file(
      "infer.json", R"({"type": "infer", "model": "r8.safetensors", "images": 256, "batch": 64,
        "latency_median_ms": 4.2, "images_per_s": 15000, "accuracy": 0.8})");
  for (const std::string& kind : {std::string(), std::string("train ")})
    expect_error(kind + infer, "got 1 row: {\"type\": \"infer\"} (`fusiontrain infer --json`)");
  const std::string mixed = temp_file(
      "mixed.jsonl", "{\"type\": \"sample\", \"text\": \"a\"}\n{\"type\": \"profile\"}\n");
  expect_error(mixed,
               "got 2 rows: {\"type\": \"sample\"} (`fusiontrain sample --json`), "
               "{\"type\": \"profile\"}; a train plot needs");
}

}  // namespace

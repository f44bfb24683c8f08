// `fusiontrain tune`: the pure parts of app/analysis/tune.h (budget split, sweep values, candidate
// overrides) and the binary on a one-layer GPT: it ends within --budget-steps, says when the
// budget stopped it, lists every measured point with its spread, skips bucket sizes on one rank
// with a note, measures the input config's own fusion as a point, tries the row tiles
// (fusion.tile_kb) or says why not, and writes a YAML that load_config accepts and that holds
// the winner.
#include "app/analysis/tune.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "app/analysis/bench.h"
#include "app/config/config.h"
#include "run_command.h"

namespace ft {
namespace {

TEST(TunePlan, BudgetSplitKeepsAWarmupAndThreeRounds) {
  TuneMeasureSize size = plan_tune_measure(100, 10);
  EXPECT_EQ(size.warmup, 2);
  EXPECT_EQ(size.rounds, 8);
  size = plan_tune_measure(5, 10);  // too little: the minimum, fewer runs then fit
  EXPECT_EQ(size.warmup, 1);
  EXPECT_EQ(size.rounds, 3);
  EXPECT_LE(plan_tune_measure(400, 7).steps_per_variant() * 7, 400);
}

TEST(TunePlan, BucketValuesArePowersOfTwoCoarseThenNeighbours) {
  EXPECT_EQ(tune_bucket_values(), (std::vector<double>{0.25, 0.5, 1, 2, 4, 8, 16, 32, 64}));
  EXPECT_EQ(tune_coarse_bucket_values(), (std::vector<double>{0.25, 1, 4, 16, 64}));
  EXPECT_EQ(tune_fine_bucket_values(4), (std::vector<double>{2, 8}));
  EXPECT_EQ(tune_fine_bucket_values(0.25), (std::vector<double>{0.5}));
  EXPECT_EQ(tune_fine_bucket_values(64), (std::vector<double>{32}));
  EXPECT_EQ(tune_max_ops_values(), (std::vector<int>{2, 3, 4, 6, 8}));
}

// The row-tile stage tries a quarter and four times the current fusion.tile_kb, inside the key's
// range and never the current value again.
TEST(TunePlan, TileKbValuesAreAQuarterAndFourTimesTheCurrent) {
  EXPECT_EQ(tune_tile_kb_values(1024), (std::vector<int>{256, 4096}));
  EXPECT_EQ(tune_tile_kb_values(8), (std::vector<int>{4, 32}));
  EXPECT_EQ(tune_tile_kb_values(4), (std::vector<int>{16}));
  EXPECT_EQ(tune_tile_kb_values(65536), (std::vector<int>{16384}));
  EXPECT_EQ(tune_tile_kb_values(30000), (std::vector<int>{7500, 65536}));
}

// The max_ops stage starts where every fusion the passes stage kept still fits in one op: the
// attention chain is 3 eager ops, Linear + GELU 2; a config capped at 2 already is left there.
TEST(TunePlan, MaxOpsStartKeepsEveryKeptFusion) {
  const std::string config = std::string(FT_SOURCE_DIR) + "/configs/gpt_tiny.yaml";
  std::vector<std::string> attention = tune_fusion_overrides({"fusion.vertical.attention"});
  EXPECT_EQ(smallest_max_ops_keeping_fusions(config, attention), 3);
  EXPECT_EQ(smallest_max_ops_keeping_fusions(
                config, tune_fusion_overrides({"fusion.vertical.gemm_epilogue"})),
            2);
  attention.push_back("fusion.max_ops=2");
  EXPECT_EQ(smallest_max_ops_keeping_fusions(config, attention), 2);
}

TEST(TunePlan, CandidateTurnsOnOnlyTheNamedPasses) {
  const std::vector<std::string> overrides =
      tune_fusion_overrides({"fusion.vertical.attention", "fusion.horizontal.qkv"});
  ASSERT_EQ(overrides.size(), bench_ablation_keys().size() + 1);
  EXPECT_EQ(overrides[0], "fusion.enabled=true");
  const Config config = parse_config("model:\n  arch: gpt\n", "test", overrides);
  EXPECT_TRUE(config.fusion.enabled);
  EXPECT_TRUE(config.fusion.vertical.attention);
  EXPECT_TRUE(config.fusion.horizontal.qkv);
  EXPECT_FALSE(config.fusion.vertical.gemm_epilogue);
  EXPECT_FALSE(config.fusion.vertical.classifier);
  EXPECT_FALSE(config.fusion.horizontal.multi_tensor);
}

// A no-op switch measures equal timings in a shuffled order: never kept, nor a change that one
// block found faster and the second did not; a real speedup in both blocks is kept.
TEST(TuneDecision, KeepsOnlyAChangeFasterBeyondNoiseTwice) {
  const TuneMeasurement same{{10, 11, 9, 10.5, 9.5, 10.2}, {9.5, 10, 10.5, 9, 11, 10.2}};
  EXPECT_FALSE(tune_faster_beyond_noise(same));
  EXPECT_FALSE(tune_keeps_change(same, same));
  const TuneMeasurement faster{{10, 11, 9, 10.5, 9.5, 10.2}, {9, 10, 8, 9.5, 8.5, 9.2}};
  EXPECT_TRUE(tune_faster_beyond_noise(faster));
  EXPECT_TRUE(tune_keeps_change(faster, faster));
  EXPECT_FALSE(tune_keeps_change(faster, same)) << "one lucky block is not enough";
  EXPECT_FALSE(tune_keeps_change(same, faster));
  EXPECT_FALSE(tune_keeps_change(faster, std::nullopt)) << "no second measurement, no change";
  // The p10 of the ratios, not their median, must clear 1.0: two slower rounds in five are noise.
  const TuneMeasurement mostly{{10, 10, 10, 10, 10}, {9, 9, 9, 10.5, 10.5}};
  EXPECT_FALSE(tune_faster_beyond_noise(mostly));
}

TEST(TuneReport, WinnerLineNamesEachKeyOnce) {
  EXPECT_EQ(
      tune_unique_overrides({"fusion.enabled=true", "fusion.max_ops=3", "comm.bucket_mb=4",
                             "fusion.max_ops=4", "comm.bucket_mb=1"}),
      (std::vector<std::string>{"fusion.enabled=true", "fusion.max_ops=4", "comm.bucket_mb=1"}));
  TuneReport report;
  report.winner_median_ms = 12.5;
  report.winner_overrides = {"fusion.enabled=true", "fusion.max_ops=3", "fusion.max_ops=4",
                             "comm.first_bucket_mb=1", "comm.first_bucket_mb=0.5"};
  const std::string text = format_tune_report(report);
  EXPECT_NE(text.find("winner: 12.50 ms/step with fusion.enabled=true fusion.max_ops=4 "
                      "comm.first_bucket_mb=0.5\n"),
            std::string::npos)
      << text;
  const nlohmann::json json = tune_json(report);
  EXPECT_EQ(json["winner"]["overrides"].size(), 3u) << json.dump(1);
  EXPECT_FALSE(json.contains("machine_load"));
  report.machine_load.measured = report.machine_load.busy = true;
  report.machine_load.load_start = 5;
  EXPECT_EQ(format_tune_report(report).find("warning: machine busy: load average 5.00"), 0u);
  EXPECT_TRUE(tune_json(report)["machine_load"]["busy"].get<bool>());
}

using test::RunResult;

RunResult run(const std::string& args) {
  return test::run_fusiontrain(args, 600);
}

// Wide enough (4 x 64 x 512 floats after c_fc) for the vertical rule to name gemm_epilogue.
const std::string kTiny =
    "tune --config configs/gpt_tiny.yaml --set model.n_layer=1 --set train.batch_size=4 "
    "--set train.threads=1 ";

nlohmann::json read_json(const std::string& path) {
  std::ifstream file(path);
  return nlohmann::json::parse(file);  // throws on malformed JSON
}

bool contains(const std::vector<std::string>& items, const std::string& item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

TEST(TuneBinary, EndsWithinItsBudgetAndWritesAConfigThatLoads) {
  const std::string json_path = ::testing::TempDir() + "/tune.json";
  const std::string yaml_path = ::testing::TempDir() + "/tuned.yaml";
  std::remove(json_path.c_str());
  std::remove(yaml_path.c_str());
  const int budget = 60;
  const RunResult result = run(kTiny + "--budget-steps " + std::to_string(budget) + " --out " +
                               yaml_path + " --json " + json_path);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("| stage | point | median ms"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("winner:"), std::string::npos) << result.output;

  const nlohmann::json json = read_json(json_path);
  EXPECT_EQ(json["budget_steps"], budget);
  EXPECT_GT(json["steps_used"].get<int>(), 0);
  EXPECT_LE(json["steps_used"].get<int>(), budget);
  const std::vector<std::string> recommended = json["recommended_keys"];
  EXPECT_TRUE(contains(recommended, "fusion.vertical.gemm_epilogue")) << json.dump(1);

  const nlohmann::json& points = json["points"];
  ASSERT_GE(points.size(), 3u) << json.dump(1);
  EXPECT_EQ(points[0]["stage"], "profile");
  EXPECT_EQ(points[0]["name"], "unfused");
  int pass_points = 0;
  for (const nlohmann::json& point : points) {
    const double median = point["median_ms"], p10 = point["p10_ms"], p90 = point["p90_ms"];
    EXPECT_GT(median, 0.0);
    EXPECT_LE(p10, median);
    EXPECT_LE(median, p90);
    if (point["stage"] == "passes" && !point["against"].get<std::string>().empty()) {
      ++pass_points;
      EXPECT_EQ(point["against"], "unfused");  // the first candidate is measured against it
      EXPECT_LE(point["speedup_p10"].get<double>(), point["speedup"].get<double>());
      EXPECT_EQ(point["within_noise"].get<bool>(), point["speedup_p10"].get<double>() <= 1.0 &&
                                                       point["speedup_p90"].get<double>() >= 1.0);
    }
  }
  EXPECT_GE(pass_points, 1);
  // The config's own fusion (gpt_tiny: every pass on) is measured against the best of the passes
  // stage, since the advice may name too little; it is a point like the others.
  int input_points = 0;
  for (const nlohmann::json& point : points) {
    if (point["stage"] != "input" || point["against"].get<std::string>().empty()) continue;
    ++input_points;
    EXPECT_EQ(point["name"], "input");
    const std::vector<std::string> overrides = point["overrides"];
    EXPECT_TRUE(contains(overrides, "fusion.enabled=true")) << point.dump();
    EXPECT_TRUE(contains(overrides, "fusion.vertical.attention=true")) << point.dump();
    EXPECT_TRUE(contains(overrides, "fusion.horizontal.qkv=true")) << point.dump();
  }
  EXPECT_EQ(input_points, 1) << json.dump(1);
  const std::vector<std::string> notes = json["notes"];
  // The row-tile stage runs (or says why not): a quarter and four times the default tile_kb.
  int tile_points = 0;
  for (const nlohmann::json& point : points) {
    if (point["stage"] != "tile_kb" || point["against"].get<std::string>().empty()) continue;
    ++tile_points;
    const std::vector<std::string> overrides = point["overrides"];
    EXPECT_TRUE(contains(overrides, "fusion.tile_kb=256") ||
                contains(overrides, "fusion.tile_kb=4096"))
        << point.dump();
  }
  const bool tile_note = std::any_of(notes.begin(), notes.end(), [](const std::string& note) {
    return note.find("tile_kb: skipped") == 0 || note.find("budget spent") == 0;
  });
  EXPECT_TRUE(tile_points > 0 || tile_note) << json.dump(1);
  bool bucket_note = false;
  for (const std::string& note : notes)
    bucket_note =
        bucket_note || note.find("comm.bucket_mb, comm.first_bucket_mb: skipped, 1 rank") == 0;
  EXPECT_TRUE(bucket_note) << json.dump(1);

  // The YAML loads and is the winner.
  const Config tuned = load_config(yaml_path);
  const std::vector<std::string> winner = json["winner"]["overrides"];
  std::vector<std::string> expected_overrides = {"model.n_layer=1", "train.batch_size=4",
                                                 "train.threads=1"};
  expected_overrides.insert(expected_overrides.end(), winner.begin(), winner.end());
  const Config expected =
      load_config(std::string(FT_SOURCE_DIR) + "/configs/gpt_tiny.yaml", expected_overrides);
  EXPECT_EQ(flatten_config(tuned), flatten_config(expected)) << json.dump(1);
  EXPECT_EQ(tuned.model.n_layer, 1);
  EXPECT_EQ(tuned.train.batch_size, 4);
}

TEST(TuneBinary, StopsWhenTheBudgetIsSpentAndSaysSo) {
  const std::string json_path = ::testing::TempDir() + "/tune_small.json";
  const std::string yaml_path = ::testing::TempDir() + "/tuned_small.yaml";
  std::remove(json_path.c_str());
  // The profile takes 1 + 3 steps; the first pass candidate, 2 x (1 + 3), no longer fits.
  const RunResult result =
      run(kTiny + "--budget-steps 10 --out " + yaml_path + " --json " + json_path);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const nlohmann::json json = read_json(json_path);
  EXPECT_EQ(json["steps_used"].get<int>(), 4) << json.dump(1);
  EXPECT_EQ(json["points"].size(), 1u) << json.dump(1);
  bool budget_note = false;
  for (const std::string& note : json["notes"].get<std::vector<std::string>>())
    budget_note = budget_note || note.find("budget spent") == 0;
  EXPECT_TRUE(budget_note) << json.dump(1);
  EXPECT_NE(result.output.find("budget spent"), std::string::npos) << result.output;
  EXPECT_NO_THROW(load_config(yaml_path));
}

}  // namespace
}  // namespace ft

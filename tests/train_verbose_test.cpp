// train.verbose on one rank: every progress line is followed by the step's learning rate and
// gradient norm (the ones metrics.jsonl records), on stdout and in log.txt; without it, by
// nothing. Several ranks add communication details (tests/mpi_*).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/run_command.h"

namespace ft {
namespace {

using test::RunResult;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Three steps of a one-layer GPT in a fresh run dir, one progress line per step.
RunResult train(const std::string& name, const std::string& extra) {
  const std::string dir =
      ::testing::TempDir() + "/train_verbose_" + std::to_string(getpid()) + "_" + name;
  std::filesystem::remove_all(dir);
  return test::run_fusiontrain(
      "train --set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 "
      "--set model.seq_len=16 --set train.batch_size=2 --set train.threads=1 "
      "--set train.steps=3 --set train.log_every=1 --set train.eval_every=0 "
      "--set train.eval_batches=1 --set optim.lr=0.002 --set optim.warmup_steps=0 "
      "--set train.run_dir=" +
          dir + " " + extra,
      120);
}

// The "  lr ..." lines of `text`.
std::vector<std::string> lr_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("  lr ", 0) == 0) lines.push_back(line);
  return lines;
}

TEST(TrainVerbose, OneRankPrintsEachStepsLrAndGradNorm) {
  const RunResult result = train("on", "--set train.verbose=true");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string dir =
      ::testing::TempDir() + "/train_verbose_" + std::to_string(getpid()) + "_on";
  std::vector<std::string> expected;
  std::istringstream metrics(read_file(dir + "/metrics.jsonl"));
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    if (row.at("type") != "step") continue;
    char text[128];
    std::snprintf(text, sizeof(text), "  lr %.2e | grad norm %.4g", row.at("lr").get<double>(),
                  row.at("grad_norm").get<double>());
    expected.push_back(text);
  }
  ASSERT_EQ(expected.size(), 3u);
  EXPECT_EQ(expected[0].rfind("  lr 2.00e-03 | grad norm ", 0), 0u) << expected[0];
  EXPECT_EQ(lr_lines(result.output), expected) << result.output;
  EXPECT_EQ(lr_lines(read_file(dir + "/log.txt")), expected);
  // Each follows its step's progress line.
  EXPECT_NE(result.output.find("step 2/3 | loss "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find(expected[1], result.output.find("step 2/3 | loss ")),
            std::string::npos)
      << result.output;
}

TEST(TrainVerbose, OffPrintsNoLr) {
  const RunResult result = train("off", "");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("step 3/3 | loss "), std::string::npos) << result.output;
  EXPECT_TRUE(lr_lines(result.output).empty()) << result.output;
}

}  // namespace
}  // namespace ft

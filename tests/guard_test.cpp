// "Training must never destroy good work", through the CLI: a diverging run stops (or skips
// steps, up to a limit) without writing a non-finite checkpoint; a fresh run refuses to write
// over another run's checkpoints; resume checks its metadata; dead writers' temp files are
// cleaned up; a --json that cannot be written is an error. Loading checks (tensor values, names,
// architecture) are in tests/guard_load_test.cpp.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "tests/guard_test_util.h"
#include "tests/run_command.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using namespace guard_test;  // the helpers of tests/guard_test_util.h

// Diverges within a few steps: plain SGD at lr 10 without clipping.
const char* const kDiverge =
    "--set optim.lr=10 --set optim.grad_clip=0 --set optim.name=sgd --set train.steps=30 ";

std::vector<std::string> checkpoints_in(const std::string& dir) {
  std::vector<std::string> files;
  if (!fs::exists(dir)) return files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

// "" when every value of every tensor is finite, else the first offender.
std::string first_non_finite(const SafetensorsFile& file) {
  for (const auto& [name, entry] : file.tensors)
    for (float value : entry.data)
      if (!std::isfinite(value)) return name;
  return "";
}

std::vector<nlohmann::json> json_lines(const std::string& path) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

TEST(GuardDivergence, NanStopsWithNonZeroExitAndNoNonFiniteCheckpoint) {
  const std::string dir = fresh_dir("nan_stop");
  const RunResult run = run_fusiontrain(
      tiny_train(dir, std::string(kDiverge) + "--set train.checkpoint_every=2"), kTimeout);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_TRUE(contains(run.output, "stopping the run (train.nan_policy: stop")) << run.output;
  EXPECT_TRUE(contains(run.output, "nan")) << run.output;
  EXPECT_TRUE(contains(run.output, "last good checkpoint: " + dir + "/ck/step_")) << run.output;
  // The hint continues the run in its folder (from its newest, the last good, checkpoint).
  EXPECT_TRUE(contains(run.output,
                       "resume with: " + std::string(FT_BINARY) + " train --resume " + dir + "\n"))
      << run.output;
  EXPECT_FALSE(fs::exists(dir + "/ck/step_000030.safetensors")) << "no final checkpoint";
  const std::vector<std::string> files = checkpoints_in(dir + "/ck");
  EXPECT_FALSE(files.empty()) << "the steps before divergence were checkpointed";
  for (const std::string& path : files)
    EXPECT_EQ(first_non_finite(load_safetensors(path)), "") << path;
}

TEST(GuardDivergence, StopBeforeAnyCheckpointSaysSo) {
  const std::string dir = fresh_dir("nan_first");
  const RunResult run = run_fusiontrain(tiny_train(dir, kDiverge), kTimeout);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_TRUE(contains(run.output, "no checkpoint written yet")) << run.output;
  EXPECT_FALSE(contains(run.output, "resume with")) << "nothing to resume from";
  EXPECT_TRUE(checkpoints_in(dir + "/ck").empty());
}

TEST(GuardDivergence, SkipStepCountsSkipsAndStopsAfterTheLimit) {
  const std::string dir = fresh_dir("skip_limit");
  const RunResult run = run_fusiontrain(
      tiny_train(dir, std::string(kDiverge) +
                          "--set train.nan_policy=skip_step --set train.max_skipped_steps=3 "
                          "--json " +
                          dir + "/m.jsonl"),
      kTimeout);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_TRUE(contains(run.output, "4 steps skipped, more than train.max_skipped_steps = 3"))
      << run.output;
  EXPECT_TRUE(contains(run.output, "update skipped (3 skipped so far")) << run.output;
  int skipped_rows = 0;
  for (const nlohmann::json& row : json_lines(dir + "/m.jsonl"))
    if (row.value("skipped", false)) ++skipped_rows;
  EXPECT_EQ(skipped_rows, 3);
  EXPECT_TRUE(checkpoints_in(dir + "/ck").empty());
}

TEST(GuardDivergence, SkippedStepsLeaveParametersAndStateUnchanged) {
  const std::string dir = fresh_dir("skip_same");
  const RunResult run = run_fusiontrain(
      tiny_train(dir, std::string(kDiverge) +
                          "--set train.steps=20 --set train.nan_policy=skip_step "
                          "--set train.max_skipped_steps=100 --set train.checkpoint_every=1 "
                          "--json " +
                          dir + "/m.jsonl"),
      kTimeout);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::vector<int> skipped, taken;
  int summary_skips = -1;
  for (const nlohmann::json& row : json_lines(dir + "/m.jsonl")) {
    if (row["type"] == "summary") summary_skips = row["skipped_steps"].get<int>();
    if (row["type"] != "step" || row["step"] == 1) continue;
    (row.value("skipped", false) ? skipped : taken).push_back(row["step"].get<int>());
  }
  ASSERT_FALSE(skipped.empty()) << "lr 10 must diverge within 20 steps:\n" << run.output;
  ASSERT_FALSE(taken.empty());
  EXPECT_EQ(summary_skips, static_cast<int>(skipped.size()));
  EXPECT_TRUE(contains(run.output, std::to_string(skipped.size()) + " steps skipped"))
      << run.output;
  const auto checkpoint = [&](int step) {
    char name[64];
    std::snprintf(name, sizeof(name), "/ck/step_%06d.safetensors", step);
    return load_safetensors(dir + name);
  };
  for (int step : skipped) {
    const SafetensorsFile before = checkpoint(step - 1), after = checkpoint(step);
    EXPECT_EQ(first_non_finite(after), "") << "step " << step;
    for (const auto& [name, entry] : after.tensors)
      EXPECT_EQ(entry.data, before.tensors.at(name).data)
          << name << " changed at skipped step " << step;
    EXPECT_EQ(after.metadata.at("optimizer_steps"), before.metadata.at("optimizer_steps"));
  }
  const int step = taken.front();
  EXPECT_NE(checkpoint(step).tensors.at("wte.weight").data,
            checkpoint(step - 1).tensors.at("wte.weight").data)
      << "a step taken changes the parameters";
}

// A ResNet's skipped step also keeps BatchNorm's running statistics, which its forward had
// already updated from the batch. BatchNorm keeps a ResNet from diverging by itself, so the run
// resumes from a checkpoint whose classifier weights are scaled by 1e30, after which the gradients
// stop being finite within a step or two.
TEST(GuardDivergence, SkippedResnetStepsKeepRunningStatistics) {
  const std::string dir = fresh_dir("skip_resnet");
  const std::string common =
      "train --config configs/resnet8.yaml --set train.batch_size=4 --set train.threads=1 "
      "--set train.eval_every=0 --set data.test_limit=8 --set optim.warmup_steps=0 "
      "--set train.checkpoint_every=1 --set train.run_dir=" +
      dir;
  const RunResult first = run_fusiontrain(common + " --set train.steps=2", kTimeout);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string good = dir + "/checkpoints/step_000002.safetensors";
  SafetensorsFile file = load_safetensors(good);
  for (float& weight : file.tensors.at("fc.weight").data) weight *= 1e30f;
  save_safetensors(good, file);
  const RunResult resumed = run_fusiontrain(
      common + " --set train.steps=5 --set train.nan_policy=skip_step --set train.resume=" + good,
      kTimeout);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  std::vector<int> skipped;
  for (const nlohmann::json& row : json_lines(dir + "/metrics.jsonl"))
    if (row["type"] == "step" && row.value("skipped", false))
      skipped.push_back(row["step"].get<int>());
  ASSERT_FALSE(skipped.empty()) << resumed.output;
  for (int step : skipped) {
    char before[64], after[64];
    std::snprintf(before, sizeof(before), "/checkpoints/step_%06d.safetensors", step - 1);
    std::snprintf(after, sizeof(after), "/checkpoints/step_%06d.safetensors", step);
    const SafetensorsFile was = load_safetensors(dir + before), is = load_safetensors(dir + after);
    for (const char* tensor : {"bn1.running_mean", "bn1.running_var", "layer3.0.bn2.running_var"})
      EXPECT_EQ(is.tensors.at(tensor).data, was.tensors.at(tensor).data)
          << tensor << " changed at skipped step " << step;
  }
}

TEST(GuardOverwrite, FreshRunRefusesADirectoryWithCheckpoints) {
  const std::string dir = fresh_dir("overwrite");
  const std::string first = trained_checkpoint(dir);
  const std::string before = read_file(first);
  const RunResult again = run_fusiontrain(tiny_train(dir), kTimeout);
  EXPECT_NE(again.exit_code, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "'" + dir + "/ck'")) << again.output;
  EXPECT_TRUE(contains(again.output, "train.overwrite: true")) << again.output;
  EXPECT_EQ(read_file(first), before) << "the refused run wrote the checkpoint";

  const RunResult forced = run_fusiontrain(tiny_train(dir, "--set train.overwrite=true"), kTimeout);
  EXPECT_EQ(forced.exit_code, 0) << forced.output;
  // Overwriting sets the previous run's checkpoints aside, unchanged, instead of mixing them in.
  EXPECT_TRUE(contains(forced.output, "note: train.overwrite: moved the previous run's"))
      << forced.output;
  std::vector<std::string> set_aside;
  for (const auto& entry : fs::directory_iterator(dir + "/ck"))
    if (entry.is_directory() && entry.path().filename().string().rfind("replaced-", 0) == 0)
      set_aside.push_back(entry.path().string());
  ASSERT_EQ(set_aside.size(), 1u) << forced.output;
  EXPECT_EQ(read_file(set_aside[0] + "/" + fs::path(first).filename().string()), before);
  const RunResult resumed =
      run_fusiontrain(tiny_train(dir, "--set train.steps=5 --set train.resume=" + first), kTimeout);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(fs::exists(dir + "/ck/step_000005.safetensors"));
}

// Writes `source` to `target` with metadata `key` set to `value`.
void with_metadata(const std::string& source, const std::string& target, const std::string& key,
                   const std::string& value) {
  SafetensorsFile file = load_safetensors(source);
  file.metadata[key] = value;
  save_safetensors(target, file);
}

TEST(GuardResume, MetadataOutOfRangeIsAnErrorNamingFileAndKey) {
  const std::string dir = fresh_dir("resume_meta");
  const std::string good = trained_checkpoint(dir);
  const std::vector<std::pair<std::string, std::string>> cases = {{"step", "3abc"},
                                                                  {"step", "-1"},
                                                                  {"step", "2000000000"},
                                                                  {"step", "3000000000"},
                                                                  {"step", "99999999999999999999"},
                                                                  {"step", ""},
                                                                  {"optimizer_steps", "-5"},
                                                                  {"optimizer_steps", "3000000000"},
                                                                  {"optimizer_steps", "2x"}};
  for (const auto& [key, value] : cases) {
    fs::remove_all(dir + "/r");
    const std::string bad = dir + "/bad.safetensors";
    with_metadata(good, bad, key, value);
    const RunResult run = run_fusiontrain(
        tiny_train(dir + "/r", "--set train.steps=5 --set train.resume=" + bad), 30);
    EXPECT_NE(run.exit_code, 0) << key << "=" << value << "\n" << run.output;
    EXPECT_NE(run.exit_code, 124) << key << "=" << value << " hung";
    EXPECT_TRUE(contains(run.output, bad + ": checkpoint metadata '" + key + "'"))
        << key << "=" << value << "\n"
        << run.output;
    EXPECT_FALSE(fs::exists(dir + "/r")) << key << "=" << value << " wrote into " << dir << "/r";
  }
}

TEST(GuardResume, FinishedRunSaysSoAndWritesNothing) {
  const std::string dir = fresh_dir("resume_done");
  const std::string done = trained_checkpoint(dir);
  const std::string out = dir + "/again";
  const RunResult run = run_fusiontrain(
      tiny_train(out, "--set train.resume=" + done + " --json " + out + "/m.jsonl"), kTimeout);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(contains(run.output, "already finished at step 3; nothing to do")) << run.output;
  EXPECT_FALSE(fs::exists(out)) << "a finished run's resume wrote into " << out;
}

// A pid that no process has now (kill fails with ESRCH).
int dead_pid() {
  for (int pid = 999999; pid > 100000; --pid)
    if (::kill(pid, 0) != 0 && errno == ESRCH) return pid;
  return -1;
}

TEST(GuardTempFiles, DeadWritersTempFilesAreRemovedLiveOnesKept) {
  const std::string dir = fresh_dir("temp");
  const int dead = dead_pid();
  ASSERT_GT(dead, 0);
  fs::create_directories(dir + "/ck");
  const std::string stale = dir + "/ck/x.safetensors.tmp." + std::to_string(dead);
  const std::string live = dir + "/ck/y.safetensors.tmp." + std::to_string(::getpid());
  const std::string not_a_pid = dir + "/ck/z.safetensors.tmp.12ab";
  for (const std::string& path : {stale, live, not_a_pid}) std::ofstream(path) << "partial";
  const RunResult run = run_fusiontrain(tiny_train(dir), kTimeout);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_FALSE(fs::exists(stale)) << run.output;
  EXPECT_TRUE(contains(run.output, "removed stale temp file " + stale)) << run.output;
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(not_a_pid));
}

TEST(GuardJson, FullDiskIsAnErrorNamingThePath) {
  const std::string dir = fresh_dir("full");
  const RunResult train = run_fusiontrain(tiny_train(dir, "--json /dev/full"), kTimeout);
  EXPECT_NE(train.exit_code, 0) << train.output;
  EXPECT_TRUE(contains(train.output, "writing --json file '/dev/full' failed")) << train.output;
  const std::string checkpoint = trained_checkpoint(dir + "/ok");
  const RunResult eval =
      run_fusiontrain("eval --checkpoint " + checkpoint + " --json /dev/full", kTimeout);
  EXPECT_NE(eval.exit_code, 0) << eval.output;
  EXPECT_TRUE(contains(eval.output, "cannot write '/dev/full': No space left on device"))
      << eval.output;
}

TEST(GuardDivergence, EveryRankStopsAtTheSameStepUnderMpirun) {
  if (test::run_shell("command -v mpirun").exit_code != 0) GTEST_SKIP() << "no mpirun";
  const std::string dir = fresh_dir("mpi");
  const RunResult run = run_fusiontrain(
      tiny_train(dir, std::string(kDiverge) + "--set train.checkpoint_every=2"), 120,
      "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np "
      "2 ");
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.exit_code, 124) << "a rank hung:\n" << run.output;
  EXPECT_TRUE(contains(run.output, "stopping the run (train.nan_policy: stop")) << run.output;
  // The ranks voted, so they stop together: one report from rank 0, and no abort.
  size_t reports = 0;
  for (size_t at = 0; (at = run.output.find("error: step ", at)) != std::string::npos; ++at)
    ++reports;
  EXPECT_EQ(reports, 1u) << run.output;
  EXPECT_TRUE(contains(run.output, "rank 0: error: step ")) << run.output;
  EXPECT_FALSE(contains(run.output, "MPI_ABORT")) << run.output;
  EXPECT_FALSE(contains(run.output, "-nan")) << run.output;
  for (const std::string& path : checkpoints_in(dir + "/ck"))
    EXPECT_EQ(first_non_finite(load_safetensors(path)), "") << path;
}

}  // namespace
}  // namespace ft

// Interrupting and resuming a run, end to end: SIGINT or SIGTERM saves the step just finished and
// prints the command that continues the run; following it finishes the run in the same folder
// with the uninterrupted run's final loss. `train --resume RUN_DIR` takes the run's config and
// newest checkpoint and refuses a changed model; `--resume CHECKPOINT` without --config takes the
// checkpoint's config; another number of ranks keeps the global batch or refuses.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/guard_test_util.h"

namespace ft {
namespace {

using namespace guard_test;
using test::run_shell;

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The metrics' summary row of the last run part: its final loss, as written.
std::string final_loss_of(const std::string& metrics_path) {
  std::istringstream in(text_of(metrics_path));
  std::string loss;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    if (row["type"] == "summary") loss = row["final_loss"].dump();
  }
  return loss;
}

// The line after "resume with: " in `output`.
std::string resume_hint(const std::string& output) {
  const std::string marker = "resume with: ";
  const size_t at = output.rfind(marker);
  if (at == std::string::npos) return "";
  const size_t from = at + marker.size();
  return output.substr(from, output.find('\n', from) - from);
}

// Starts `train_args` in the background from the source directory, sends `signals` (e.g. "INT"
// or "INT INT") once the run has logged its 3rd metrics row, and returns the output with
// "status=N" appended.
RunResult interrupted(const std::string& dir, const std::string& train_args,
                      const std::string& signals) {
  std::string kills;
  for (std::istringstream names(signals); names.good();) {
    std::string name;
    names >> name;
    if (!name.empty()) kills += "kill -" + name + " $pid; ";
  }
  const std::string metrics = dir + "/metrics.jsonl";
  return run_shell("cd " + std::string(FT_SOURCE_DIR) + " && timeout 120 sh -c '" + FT_BINARY +
                   " " + train_args + " > " + dir + "/out.txt 2>&1 & pid=$!; i=0; until [ $(cat " +
                   metrics + " 2>/dev/null | wc -l) -ge 3 ] || [ $i -ge 1200 ]; do sleep 0.05; " +
                   "i=$((i+1)); done; " + kills + "wait $pid; echo status=$?'");
}

// With the default config (no checkpoint_every), a SIGINT or SIGTERM mid-run saves the step just
// finished; following the printed command finishes the run in the same folder, with the loss of
// a run never interrupted.
TEST(Interrupt, FollowingTheHintFinishesTheRunWithTheUninterruptedLoss) {
  const std::string steps = "--set train.steps=40 --set train.threads=1 --set train.eval_every=0";
  const std::string reference = fresh_dir("uninterrupted");
  const RunResult whole =
      run_fusiontrain("train " + steps + " --set train.run_dir=" + reference, 300);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::string expected = final_loss_of(reference + "/metrics.jsonl");
  ASSERT_FALSE(expected.empty()) << whole.output;
  for (const auto& [signal_name, status] : {std::pair{"INT", 130}, std::pair{"TERM", 143}}) {
    const std::string dir = fresh_dir(std::string("interrupted_") + signal_name);
    const RunResult stopped =
        interrupted(dir, "train " + steps + " --set train.run_dir=" + dir, signal_name);
    const std::string out = text_of(dir + "/out.txt");
    ASSERT_TRUE(contains(stopped.output, "status=" + std::to_string(status))) << out;
    const std::string said = std::string("interrupted by SIG") + signal_name + " after step ";
    ASSERT_TRUE(contains(out, said)) << out;
    const int step = std::atoi(out.c_str() + out.find(said) + said.size());
    EXPECT_GE(step, 3) << out;
    char checkpoint[64];
    std::snprintf(checkpoint, sizeof(checkpoint), "/checkpoints/step_%06d.safetensors", step);
    EXPECT_TRUE(std::filesystem::exists(dir + checkpoint)) << out;
    EXPECT_TRUE(contains(text_of(dir + "/log.txt"), said)) << "the log misses the stop";
    const std::string hint = resume_hint(out);
    EXPECT_EQ(hint, std::string(FT_BINARY) + " train --resume " + dir) << out;
    const RunResult resumed =
        run_shell("cd " + std::string(FT_SOURCE_DIR) + " && timeout 300 " + hint);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_EQ(final_loss_of(dir + "/metrics.jsonl"), expected) << resumed.output;
    EXPECT_TRUE(contains(text_of(dir + "/log.txt"), "done: ")) << "log.txt not appended";
  }
}

// A second signal does not wait for the step: it stops at once, naming the step. (Two SIGINTs
// sent together would merge into one pending signal; a SIGINT and a SIGTERM do not.)
TEST(Interrupt, SecondSignalStopsAtOnce) {
  const std::string dir = fresh_dir("twice");
  const RunResult stopped = interrupted(
      dir, "train --set train.steps=1000000 --set train.threads=1 --set train.run_dir=" + dir,
      "INT TERM");
  const std::string out = text_of(dir + "/out.txt");
  // The kernel delivers the two pending signals in either order; the second one names itself.
  const bool term_second = contains(out, "interrupted by SIGTERM again at step ");
  EXPECT_TRUE(term_second || contains(out, "interrupted by SIGINT again at step ")) << out;
  EXPECT_TRUE(contains(stopped.output, term_second ? "status=143" : "status=130")) << out;
  EXPECT_FALSE(contains(out, "saved checkpoint")) << out;
}

TEST(Resume, RunDirRefusesAnotherModelNamingBothValues) {
  const std::string dir = fresh_dir("another_model");
  ASSERT_EQ(run_fusiontrain(tiny_train(dir), kTimeout).exit_code, 0);
  const RunResult changed =
      run_fusiontrain("train --resume " + dir + " --set model.n_layer=2", kTimeout);
  EXPECT_EQ(changed.exit_code, 1) << changed.output;
  EXPECT_TRUE(contains(
      changed.output, "model.n_layer is '1' in the run (" + dir + "/config.yaml) but '2' in --set"))
      << changed.output;
  // What may change: the number of steps. The run goes on from its step 3 in the same folder.
  const RunResult longer =
      run_fusiontrain("train --resume " + dir + " --set train.steps=5", kTimeout);
  ASSERT_EQ(longer.exit_code, 0) << longer.output;
  EXPECT_TRUE(contains(longer.output, "resumed at step 3")) << longer.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/ck/step_000005.safetensors")) << longer.output;
}

TEST(Resume, FolderThatIsNoRunOrHasNoCheckpointIsRefused) {
  const std::string dir = fresh_dir("no_run");
  const RunResult no_run = run_fusiontrain("train --resume " + dir, kTimeout);
  EXPECT_EQ(no_run.exit_code, 1) << no_run.output;
  EXPECT_TRUE(contains(no_run.output, "not a run folder (it has no config.yaml)")) << no_run.output;
  ASSERT_EQ(run_fusiontrain(tiny_train(dir), kTimeout).exit_code, 0);
  std::filesystem::remove_all(dir + "/ck");
  const RunResult empty = run_fusiontrain("train --resume " + dir, kTimeout);
  EXPECT_EQ(empty.exit_code, 1) << empty.output;
  EXPECT_TRUE(contains(empty.output, "holds no step_*.safetensors")) << empty.output;
}

// Without --config a checkpoint's own config is used: the default config (4 layers) would not
// match this 1-layer checkpoint.
TEST(Resume, CheckpointWithoutConfigUsesItsEmbeddedConfig) {
  const std::string dir = fresh_dir("embedded");
  const std::string checkpoint = trained_checkpoint(dir, 2);
  const RunResult resumed =
      run_fusiontrain("train --resume " + checkpoint + " --set train.steps=3", kTimeout);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/ck/step_000003.safetensors")) << resumed.output;
}

// A 2-rank run resumed on 1 rank keeps its global batch of 4 sequences with train.grad_accum 2;
// on 3 ranks 4 cannot be split, and the resume says so with the numbers.
TEST(Resume, AnotherNumberOfRanksKeepsTheGlobalBatchOrRefuses) {
  const std::string dir = fresh_dir("ranks");
  const std::string mpirun =
      "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np ";
  const RunResult two = run_fusiontrain(tiny_train(dir), 120, mpirun + "2 ");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const RunResult one = run_fusiontrain("train --resume " + dir + " --set train.steps=4", kTimeout);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_TRUE(contains(one.output,
                       "global batch of 4 (train.batch_size 2 x train.grad_accum 1 x 2 "
                       "ranks); on 1 rank(s) train.grad_accum is 2 (was 1)"))
      << one.output;
  const RunResult three =
      run_fusiontrain("train --resume " + dir + " --set train.steps=5", 120, mpirun + "3 ");
  EXPECT_NE(three.exit_code, 0) << three.output;
  EXPECT_TRUE(contains(three.output, "which 3 rank(s) cannot keep")) << three.output;
}

}  // namespace
}  // namespace ft

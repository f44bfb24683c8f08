// Crash safety of training, end to end: a run that checkpoints every step is killed with SIGKILL
// at random moments five times, each time resumed from its newest checkpoint, then finished.
// Afterwards every checkpoint loads, no temp file of a dead writer remains, and the final loss is
// the uninterrupted run's. And with two ranks under mpirun, killing one ends the job within 30 s
// with a message and a non-zero exit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "tests/run_command.h"

namespace ft {
namespace {

using test::run_shell;

constexpr int kSteps = 400;

std::string train_command(const std::string& dir, const std::string& extra) {
  return std::string(FT_BINARY) +
         " train --config configs/gpt_tiny.yaml --set model.n_layer=1 --set model.d_model=32 "
         "--set model.n_head=2 --set model.seq_len=32 --set train.batch_size=4 "
         "--set train.steps=" +
         std::to_string(kSteps) +
         " --set train.checkpoint_every=1 --set train.eval_every=0 --set train.log_every=10 "
         "--set train.threads=1 --set optim.warmup_steps=0 --set train.run_dir=" +
         dir + " --set train.checkpoint_dir=" + dir + "/ck" + extra;
}

std::string in_source(const std::string& command) {
  return std::string("cd ") + FT_SOURCE_DIR + " && " + command;
}

// "final loss 1.2345" from the done line.
std::string final_loss(const std::string& output) {
  const std::string key = "final loss ";
  const size_t at = output.rfind(key);
  if (at == std::string::npos) return "";
  return output.substr(at + key.size(),
                       output.find_first_of(" |\n", at + key.size()) - at - key.size());
}

std::vector<std::string> files_in(const std::string& dir, const std::string& contains) {
  std::vector<std::string> found;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error))
    if (entry.path().filename().string().find(contains) != std::string::npos)
      found.push_back(entry.path().string());
  std::sort(found.begin(), found.end());
  return found;
}

// Finished checkpoints only: a run killed mid-write leaves step_N.safetensors.tmp.PID behind
// (removed by the next run's first checkpoint), which a resume must not pick.
std::vector<std::string> checkpoints_in(const std::string& dir) {
  std::vector<std::string> found;
  for (const std::string& path : files_in(dir, "step_"))
    if (path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0)
      found.push_back(path);
  return found;
}

TEST(KillDuringTraining, EveryCheckpointLoadsAndResumeGivesTheUninterruptedLoss) {
  const std::string root = ::testing::TempDir() + "/kill_" + std::to_string(getpid());
  std::filesystem::remove_all(root);
  const test::RunResult straight =
      run_shell(in_source("timeout 300 " + train_command(root + "/a", "")));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::string expected = final_loss(straight.output);
  ASSERT_FALSE(expected.empty()) << straight.output;

  const std::string dir = root + "/b";
  std::mt19937 random(7);
  // Each kill lands a random number of checkpoints (5 to 60) after the previous one, at whatever
  // the writer is doing then: mid-step, or mid-way through a checkpoint write.
  std::uniform_int_distribution<int> more_steps(5, 60);
  for (int kill = 0; kill < 5; ++kill) {
    const std::vector<std::string> done = checkpoints_in(dir + "/ck");
    const std::string resume =
        done.empty() ? "" : " --set train.resume=" + done.back() + " --set train.overwrite=true";
    const std::string target = std::to_string(done.size() + more_steps(random));
    run_shell(in_source("mkdir -p " + dir + "/ck; (" + train_command(dir, resume) +
                        " > /dev/null 2>&1 & pid=$!; while kill -0 $pid 2>/dev/null && [ $(ls " +
                        dir + "/ck | grep -c step_) -lt " + target +
                        " ]; do sleep 0.005; done; kill -9 $pid; wait $pid) 2>/dev/null"));
  }
  const std::vector<std::string> before = checkpoints_in(dir + "/ck");
  ASSERT_FALSE(before.empty()) << "no checkpoint survived five kills; kill later";
  const test::RunResult finish =
      run_shell("timeout 300 " + train_command(dir, " --set train.resume=" + before.back() +
                                                        " --set train.overwrite=true"));
  ASSERT_EQ(finish.exit_code, 0) << finish.output;
  EXPECT_EQ(final_loss(finish.output), expected) << finish.output;

  for (const std::string& path : files_in(dir + "/ck", ".safetensors")) {
    EXPECT_EQ(path.find(".tmp"), std::string::npos) << "temp file left behind: " << path;
    EXPECT_NO_THROW(load_safetensors(path)) << path;
  }
  if (!HasFailure()) std::filesystem::remove_all(root);
}

TEST(KillDuringTraining, ARankDyingEndsTheJob) {
  const std::string dir = ::testing::TempDir() + "/rank_death_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // The newest process matching the run's command line is one of its two ranks (mpirun's own
  // command line starts with "mpirun"); it is killed 4 s in.
  const std::string marker = "train.steps=100000";
  std::ofstream(dir + "/run.sh")
      << "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\n"
      << "cd " << FT_SOURCE_DIR << "\n"
      << "start=$(date +%s)\n"
      << "timeout 120 mpirun --oversubscribe -np 2 " << FT_BINARY
      << " train --config configs/gpt_tiny.yaml --set " << marker
      << " --set train.threads=1 --set train.run_dir=" << dir
      << "/run --set train.checkpoint_dir=" << dir << "/run/ck > " << dir << "/log.txt 2>&1 &\n"
      << "job=$!\n"
      << "sleep 4\n"
      << "pkill -9 -n -f '^" << FT_BINARY << " train .*" << marker << "'\n"
      << "wait $job; echo \"exit=$?\"\n"
      << "echo \"seconds=$(( $(date +%s) - start ))\"\n"
      << "cat " << dir << "/log.txt\n";
  const test::RunResult result = run_shell("bash " + dir + "/run.sh");
  const size_t seconds_at = result.output.find("seconds=");
  ASSERT_NE(seconds_at, std::string::npos) << result.output;
  EXPECT_LT(std::stoi(result.output.substr(seconds_at + 8)), 4 + 30) << result.output;
  EXPECT_EQ(result.output.find("exit=0"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("exit=124"), std::string::npos) << "timed out: " << result.output;
  EXPECT_NE(result.output.find("signal 9"), std::string::npos) << result.output;  // mpirun's note
}

}  // namespace
}  // namespace ft

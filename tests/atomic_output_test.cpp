// Atomic outputs never replace what is not a regular file, and leave no temp file behind a signal:
// resolve_output_target refuses a device node, a directory, a pipe and a dangling link by name,
// and follows a link to a regular file (the link stays a link); AtomicFileWriter refuses the same
// before creating anything; a SIGINT or SIGTERM mid-write (InterruptHandlers) removes the temp
// file before the process exits; jobs refuse such --out and --trace paths before any work, and
// tune refuses an --out that is its own --config.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "app/training/run_layout.h"
#include "core/atomic_file.h"
#include "core/check.h"
#include "tests/run_command.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

class AtomicOutput : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/atomic_output_" + std::to_string(::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string at(const std::string& name) const { return dir_ + "/" + name; }

  // The error of resolve_output_target(path), or "" when it accepts the path.
  static std::string refusal(const std::string& path) {
    try {
      resolve_output_target(path, "--out");
    } catch (const Error& error) {
      return error.what();
    }
    return "";
  }

  std::string dir_;
};

TEST_F(AtomicOutput, RefusesWhatIsNotARegularFile) {
  ASSERT_EQ(::mkfifo(at("pipe").c_str(), 0600), 0);
  fs::create_directories(at("folder"));
  fs::create_symlink(at("missing"), at("dangling"));
  fs::create_symlink(at("folder"), at("to_folder"));
  EXPECT_NE(refusal(at("pipe")).find("it exists and is a pipe, not a regular file"),
            std::string::npos);
  EXPECT_NE(refusal(at("folder")).find("it exists and is a directory"), std::string::npos);
  EXPECT_NE(refusal(at("dangling")).find("a symbolic link to a missing file"), std::string::npos);
  EXPECT_NE(refusal(at("to_folder")).find("a symbolic link to a directory"), std::string::npos);
  // A character device like /dev/full, made here (as root) rather than touching the real one.
  if (::mknod(at("full").c_str(), S_IFCHR | 0600, makedev(1, 7)) == 0) {
    EXPECT_NE(refusal(at("full"))
                  .find("--out '" + at("full") +
                        "': it exists and is a character "
                        "device"),
              std::string::npos);
    EXPECT_THROW(write_file_atomic(at("full"), "bytes"), Error);
    EXPECT_TRUE(fs::is_character_file(at("full"))) << "the device node was replaced";
    EXPECT_FALSE(fs::exists(at("full") + ".tmp." + std::to_string(::getpid())));
  }
  EXPECT_EQ(refusal(at("new_file")), "");
}

TEST_F(AtomicOutput, FollowsALinkToARegularFile) {
  write_file_atomic(at("real"), "old");
  fs::create_symlink("real", at("link"));
  EXPECT_EQ(resolve_output_target(at("link"), "--out"), fs::canonical(at("real")).string());
  write_file_atomic(at("link"), "new");
  EXPECT_TRUE(fs::is_symlink(at("link"))) << "the link was replaced by a file";
  EXPECT_EQ(read_file(at("real")), "new");
}

TEST_F(AtomicOutput, InterruptRemovesTheTempFileInProgress) {
  for (int signo : {SIGINT, SIGTERM}) {
    const std::string path = at("checkpoint_" + std::to_string(signo));
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      InterruptHandlers handlers(false, -1);
      AtomicFileWriter writer(path);
      writer.append("partial", 7);
      ::raise(signo);  // the first only asks the training loop to stop after its step
      ::raise(signo);
      ::_exit(0);  // not reached: the second signal's handler exits
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 128 + signo);
    EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(child))) << "temp file left behind";
    EXPECT_FALSE(fs::exists(path));
  }
}

TEST_F(AtomicOutput, JobsRefuseSuchOutputsBeforeAnyWork) {
  ASSERT_EQ(::mkfifo(at("pipe").c_str(), 0600), 0);
  const test::RunResult exported = test::run_fusiontrain(
      "export --checkpoint " + at("no_such_checkpoint") + " --out " + at("pipe"), 60);
  EXPECT_EQ(exported.exit_code, 1);
  EXPECT_NE(exported.output.find("--out '" + at("pipe") + "': it exists and is a pipe"),
            std::string::npos)
      << exported.output;
  const test::RunResult traced = test::run_fusiontrain(
      "bench --variants unfused --steps 1 --warmup 1 --trace " + at("pipe"), 60);
  EXPECT_EQ(traced.exit_code, 1);
  EXPECT_NE(traced.output.find("--trace '" + at("pipe") + "'"), std::string::npos) << traced.output;
  EXPECT_EQ(traced.output.find("ms"), std::string::npos) << "bench ran: " << traced.output;
  const std::string config = std::string(FT_SOURCE_DIR) + "/configs/gpt_tiny.yaml";
  fs::copy_file(config, at("tune.yaml"));
  const std::string before = read_file(at("tune.yaml"));
  const test::RunResult tuned = test::run_fusiontrain(
      "tune --config " + at("tune.yaml") + " --out " + at("tune.yaml") + " --budget-steps 10", 60);
  EXPECT_EQ(tuned.exit_code, 2);  // a usage error
  EXPECT_NE(tuned.output.find("is the --config tune reads"), std::string::npos) << tuned.output;
  EXPECT_EQ(read_file(at("tune.yaml")), before);
}

// kill -9 during a fresh run's first checkpoint leaves its temp file and the run's config.yaml;
// the same command again is refused (the run dir is taken), but the temp file goes first.
TEST_F(AtomicOutput, ARefusedRerunStillRemovesTheKilledRunsTempFile) {
  const pid_t gone = ::fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);  // its pid names no live process now
  fs::create_directories(at("run/checkpoints"));
  write_file_atomic(at("run/config.yaml"), "# the killed run's\n");
  const std::string temp = at("run/checkpoints/step_5.safetensors.tmp." + std::to_string(gone));
  write_file_atomic(temp, "half a checkpoint");
  const test::RunResult rerun =
      test::run_fusiontrain("train --set train.steps=5 --set train.run_dir=" + at("run"), 60);
  EXPECT_EQ(rerun.exit_code, 1) << rerun.output;
  EXPECT_NE(rerun.output.find("already holds another run's files"), std::string::npos)
      << rerun.output;
  EXPECT_NE(rerun.output.find("removed stale temp file " + temp), std::string::npos)
      << rerun.output;
  EXPECT_FALSE(fs::exists(temp));
}

}  // namespace
}  // namespace ft

// The binary's handling of bad input: every case exits non-zero with a message that names the
// file, line, key or allowed values — never a crash, a hang or a silent default.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

#include "run_command.h"

namespace {

using ft::test::RunResult;

// Runs `prefix fusiontrain args` from the source directory, with a hard timeout so a hang fails.
RunResult run_command(const std::string& prefix, const std::string& args) {
  return ft::test::run_fusiontrain(args, 60, prefix);
}

RunResult run(const std::string& args) {
  return run_command("", args);
}

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

void expect_error(const RunResult& result, const std::string& needle) {
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.exit_code, 124) << "timed out: " << result.output;
  EXPECT_LT(result.exit_code, 128) << "crashed: " << result.output;
  EXPECT_NE(result.output.find(needle), std::string::npos)
      << "expected '" << needle << "' in: " << result.output;
}

TEST(Cli, UnknownConfigKeyNamesFileLineAndSuggestion) {
  const std::string path = temp_file("bad_key.yaml", "model:\n  arch: gpt\n  n_layr: 4\n");
  const RunResult result = run("train --config " + path);
  expect_error(result, path + ":3:3: unknown key 'n_layr'");
  expect_error(result, "did you mean 'n_layer'");
}

TEST(Cli, BadValueNamesAllowedRange) {
  expect_error(run("train --set model.n_layer=0"), "model.n_layer");
  expect_error(run("train --set optim.name=adam"), "adamw, sgd");
  expect_error(run("train --set model.n_head=3"), "divisible");
}

TEST(Cli, MissingAndEmptyConfigFiles) {
  expect_error(run("train --config /nonexistent/x.yaml"), "/nonexistent/x.yaml");
  expect_error(run("train --config " + temp_file("empty.yaml", "# nothing\n")), "empty");
}

TEST(Cli, UnknownFlagAndMissingJob) {
  expect_error(run("train --bogus"), "--bogus");
  expect_error(run(""), "subcommand");
}

TEST(Cli, CorruptCheckpointIsAClearError) {
  const std::string path = temp_file("corrupt.safetensors",
                                     std::string("\x10\x00\x00\x00\x00\x00\x00\x00{not json}", 18));
  expect_error(run("eval --checkpoint " + path), path);
  expect_error(run("eval --checkpoint /nonexistent.safetensors"), "/nonexistent.safetensors");
}

// Two ranks launched MPMD-style with different batch sizes: every rank must stop with an error
// that names the differing key, quickly, instead of hanging in a collective.
TEST(Cli, MismatchedConfigAcrossRanksFailsFast) {
  const std::string mpirun =
      "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 1 ";
  const RunResult result =
      run_command(mpirun, "train --set train.steps=30 : -np 1 " + std::string(FT_BINARY) +
                              " train --set train.steps=30 --set train.batch_size=16");
  expect_error(result, "train.batch_size");
  expect_error(result, "differs across ranks");
}

// A process that no MPI launcher started never initialises MPI, so a machine with the library
// but no working runtime (Open MPI's singleton start cannot fork its daemon: here, no rsh agent)
// still trains, plans and infers; bandwidth, which measures MPI, still needs it.
TEST(Cli, JobsRunWithoutAnMpiRuntimeWhenNotLaunchedByMpirun) {
  const std::string no_runtime = "env OMPI_MCA_plm_rsh_agent=/nonexistent/ssh ";
  const RunResult train = ft::test::run_fusiontrain(
      "train --set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 "
      "--set train.steps=2 --set train.eval_every=0 --set train.batch_size=2 "
      "--set train.run_dir=" +
          ::testing::TempDir() + "/no_mpi_run --set train.overwrite=true",
      120, no_runtime);
  EXPECT_EQ(train.exit_code, 0) << train.output;
  EXPECT_NE(train.output.find("done: 2 steps"), std::string::npos) << train.output;
  const RunResult bandwidth =
      ft::test::run_fusiontrain("bandwidth --max-bytes 1024", 60, no_runtime);
  EXPECT_NE(bandwidth.exit_code, 0) << "bandwidth initialises MPI, which cannot start here:\n"
                                    << bandwidth.output;
}

}  // namespace

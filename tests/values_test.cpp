// Every bad config value is refused with a message that names where it was set, the key and what
// is allowed, and never our source (".cpp:"): float underflow and rounding, YAML tags, train.device
// cuda, warmup longer than a short run, oversized config files; plus the same refusals end to end
// through the fusiontrain binary, each under a short timeout so an unbounded read fails the test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "app/config/config.h"
#include "core/check.h"
#include "tests/run_command.h"

namespace ft {
namespace {

std::string temp_dir() {
  const std::string dir = ::testing::TempDir() + "/values_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  return dir;
}

// The ft::Error message of parse_config, or "" (and a test failure) when it was accepted.
std::string parse_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(yaml, "cfg.yaml", overrides);
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "accepted:\n" << yaml;
  return "";
}

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

void expect_user_error(const std::string& text) {
  EXPECT_EQ(text.find(".cpp:"), std::string::npos)
      << "internal check text reached the user: " << text;
  EXPECT_EQ(text.find("check `"), std::string::npos) << text;
}

const char kGpt[] = "model:\n  arch: gpt\n";

TEST(ValuesFloat, UnderflowToZeroIsRefused) {
  const std::string lr = parse_error(kGpt, {"optim.lr=1e-50"});
  expect_has(lr, "--set 'optim.lr=1e-50': optim.lr: 1e-50 rounds to 0 as a float; must be above 0");
  expect_has(lr, "(0, 10]");
  expect_user_error(lr);
  const std::string eps = parse_error("optim:\n  eps: 1e-60\n");
  expect_has(eps, "cfg.yaml:2:8: optim.eps: 1e-60 rounds to 0 as a float; must be above 0");
  expect_user_error(eps);
  const std::string fraction = parse_error(kGpt, {"data.val_fraction=1e-50"});
  expect_has(fraction, "data.val_fraction: 1e-50 rounds to 0 as a float");
}

TEST(ValuesFloat, RoundingUpToAnOpenBoundIsRefused) {
  const std::string beta1 = parse_error(kGpt, {"optim.beta1=0.99999999999"});
  expect_has(beta1, "optim.beta1: 0.99999999999 rounds to 1 as a float; must be below 1");
  expect_has(beta1, "[0, 1)");
  expect_user_error(beta1);
  const std::string beta2 = parse_error("optim:\n  beta2: 0.999999999\n");
  expect_has(beta2, "cfg.yaml:2:10: optim.beta2: 0.999999999 rounds to 1 as a float");
}

TEST(ValuesFloat, SubnormalIsRefusedAndNormalSmallValuesPass) {
  const std::string lr = parse_error(kGpt, {"optim.lr=1e-40"});
  expect_has(lr, "optim.lr: 1e-40 is too small for a float");
  expect_has(lr, "use at least 1.1754944e-38");
  expect_has(parse_error(kGpt, {"optim.min_lr=1e-40"}), "use 0 or at least");
  const Config small = parse_config(
      kGpt, "cfg.yaml",
      {"optim.lr=1e-30", "optim.min_lr=0", "optim.beta1=0.9999999", "optim.eps=1e-37"});
  EXPECT_EQ(small.optim.lr, 1e-30f);
  EXPECT_LT(small.optim.beta1, 1.0f);
  EXPECT_GT(small.optim.eps, 0.0f);
}

TEST(ValuesYaml, TagsAreRefusedLikeQuotedNumbers) {
  const std::string core = parse_error("model:\n  n_layer: !!str 4\n");
  expect_has(core, "cfg.yaml:2:12: model.n_layer: expected an integer in [1, 64]");
  expect_has(core, "YAML tag '!!str'");
  expect_user_error(core);
  const std::string local = parse_error("model:\n  n_layer: !weird 4\n");
  expect_has(local, "model.n_layer");
  expect_has(local, "YAML tag '!weird'");
  expect_has(parse_error("optim:\n  lr: !!float 1e-3\n"), "YAML tag '!!float'");
  expect_has(parse_error("data:\n  path: !x a.txt\n"), "data.path");
  // The plain and quoted forms keep working as before.
  EXPECT_EQ(parse_config("model:\n  n_layer: 4\n", "cfg.yaml").model.n_layer, 4);
  expect_has(parse_error("model:\n  n_layer: \"4\"\n"), "the quoted string '4'");
}

TEST(ValuesDevice, CudaParsesAndOtherSpellingsGetTheRightName) {
  EXPECT_EQ(parse_config("train:\n  device: cuda\n", "cfg.yaml").train.device, "cuda");
  EXPECT_EQ(parse_config("train:\n  device: cpu\n", "cfg.yaml").train.device, "cpu");
  const std::string gpu = parse_error("train:\n  device: gpu\n");
  expect_has(gpu, "cfg.yaml:2:11: train.device: expected one of: cpu, cuda, got 'gpu'");
  expect_has(gpu, "the GPU is spelled cuda");
  expect_user_error(gpu);
  expect_has(parse_error(kGpt, {"train.device=cuda:1"}), "--set 'train.device=cuda:1'");
  expect_has(parse_error("train:\n  tf32: true\n"),
             "requires train.device = cuda, got train.device = cpu");
}

TEST(ValuesWarmup, DefaultedWarmupShrinksToAShortRunWithANote) {
  // Captured output must be released even when parse_config throws, or gtest's own goes with it.
  Config config;
  std::string error;
  ::testing::internal::CaptureStdout();
  try {
    config = parse_config(kGpt, "cfg.yaml", {"train.steps=10"});
  } catch (const Error& e) {
    error = e.what();
  }
  const std::string note = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(error, "");
  EXPECT_EQ(config.optim.warmup_steps, 10);
  expect_has(note, "note: optim.warmup_steps defaults to 20, more than train.steps = 10; using 10");
  EXPECT_EQ(std::count(note.begin(), note.end(), '\n'), 1) << note;

  ::testing::internal::CaptureStdout();
  const Config long_run = parse_config(kGpt, "cfg.yaml", {"train.steps=100"});
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "");
  EXPECT_EQ(long_run.optim.warmup_steps, 20);
}

TEST(ValuesWarmup, WarmupTheUserSetStaysAnError) {
  const std::string file = parse_error("train:\n  steps: 10\noptim:\n  warmup_steps: 20\n");
  expect_has(file, "optim.warmup_steps = 20 (cfg.yaml:4:17) must not exceed train.steps = 10");
  const std::string set = parse_error(kGpt, {"optim.warmup_steps=20", "train.steps=10"});
  expect_has(set, "optim.warmup_steps = 20 (--set 'optim.warmup_steps=20')");
  expect_user_error(set);
}

TEST(ValuesConfigFile, OversizedAndEndlessFilesAreRefused) {
  try {
    load_config("/dev/zero");
    ADD_FAILURE() << "/dev/zero accepted as a config";
  } catch (const Error& error) {
    expect_has(error.what(), "/dev/zero: is a character device, not a config file");
    expect_user_error(error.what());
  }
  const std::string big = temp_dir() + "/big.yaml";
  {
    std::ofstream out(big);
    out << "model:\n  arch: gpt\n";
    const std::string comment = "# " + std::string(1021, 'x') + "\n";
    for (int i = 0; i < 4 * 1024; ++i) out << comment;
  }
  try {
    load_config(big);
    ADD_FAILURE() << "a config over 4 MiB was accepted";
  } catch (const Error& error) {
    expect_has(error.what(), big + ": config file is larger than 4 MiB");
  }
  std::filesystem::resize_file(big, kMaxConfigBytes);  // exactly the cap still parses
  EXPECT_EQ(load_config(big).model.arch, "gpt");
}

// ---- End to end: the binary exits quickly with the message and without source locations.

std::string run_dirs() {
  const std::string dir = temp_dir() + "/run";
  return " --set train.run_dir=" + dir + " --set train.checkpoint_dir=" + dir + "/checkpoints";
}

void expect_cli_error(const test::RunResult& result, const std::string& part) {
  EXPECT_NE(result.exit_code, 124) << "timed out (unbounded read?):\n" << result.output;
  EXPECT_NE(result.exit_code, 0) << result.output;
  expect_has(result.output, part);
  expect_user_error(result.output);
}

TEST(ValuesCli, DevZeroAsConfigDataOrCheckpointEndsQuickly) {
  expect_cli_error(test::run_fusiontrain("train --config /dev/zero", 20),
                   "/dev/zero: is a character device, not a config file");
  expect_cli_error(test::run_fusiontrain("train --set data.path=/dev/zero" + run_dirs(), 20),
                   "text data file /dev/zero: is a character device, not a regular file");
  expect_cli_error(test::run_fusiontrain("eval --checkpoint /dev/zero", 20),
                   "/dev/zero: not a regular file");
}

TEST(ValuesCli, FloatRoundingDeviceAndValFraction) {
  expect_cli_error(test::run_fusiontrain("train --set optim.beta2=0.99999999999" + run_dirs(), 20),
                   "optim.beta2: 0.99999999999 rounds to 1 as a float; must be below 1");
  // Without a GPU (or a CUDA build), cuda is refused at start-up, before any step.
  expect_cli_error(test::run_fusiontrain("train --set train.device=cuda" + run_dirs(), 20),
                   "train.device: cuda needs ");
  // 1e-5 of Moby Dick is 12 bytes, less than one 65-byte window: refused before step 1.
  const test::RunResult fraction =
      test::run_fusiontrain("train --set data.val_fraction=1e-5" + run_dirs(), 30);
  expect_cli_error(fraction, "data.val_fraction = 1e-05 holds out 12 of the");
  expect_has(fraction.output, "model.seq_len + 1 = 65 bytes");
  EXPECT_EQ(fraction.output.find("step 1/"), std::string::npos) << fraction.output;
}

TEST(ValuesCli, QuickRunJustWorks) {
  std::filesystem::remove_all(temp_dir() + "/run");  // a fresh run, also when the test reruns
  const test::RunResult result = test::run_fusiontrain(
      "train --set train.steps=2 --set model.n_layer=1 --set train.eval_batches=1" + run_dirs(),
      120);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  expect_has(result.output, "note: optim.warmup_steps defaults to 20, more than train.steps = 2");
  expect_has(result.output, "done: 2 steps");
  const std::string note = "note: optim.warmup_steps";
  EXPECT_EQ(result.output.find(note), result.output.rfind(note)) << "printed more than once";
}

}  // namespace
}  // namespace ft

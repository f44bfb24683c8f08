// Shared by tests/guard_test.cpp and tests/guard_load_test.cpp: a fresh directory per test, the
// tiny one-layer GPT training command, and a trained checkpoint to corrupt or load.
// Thread safety: none needed; each test runs in its own process.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "tests/run_command.h"

namespace ft::guard_test {

// Test files `using namespace guard_test;` for these and the helpers below.
using test::run_fusiontrain;
using test::RunResult;

inline constexpr int kTimeout = 60;

// A fresh directory per test (ctest runs every test as its own process, in parallel).
inline std::string fresh_dir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/guard_" + std::to_string(::getpid()) + "_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A one-layer GPT that trains a step in milliseconds, writing under `dir`.
inline std::string tiny_train(const std::string& dir, const std::string& extra = "",
                              const std::string& config = "configs/gpt_tiny.yaml") {
  return "train --config " + config +
         " --set model.n_layer=1 --set model.d_model=16 "
         "--set model.n_head=2 --set model.seq_len=16 --set train.batch_size=2 "
         "--set train.threads=1 --set train.eval_every=0 --set train.eval_batches=1 "
         "--set optim.warmup_steps=0 --set train.steps=3 --set train.run_dir=" +
         dir + " --set train.checkpoint_dir=" + dir + "/ck " + extra;
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Trains the tiny model for `steps` into dir/ck and returns the final checkpoint's path.
inline std::string trained_checkpoint(const std::string& dir, int steps = 3,
                                      const std::string& extra = "") {
  const RunResult run = run_fusiontrain(
      tiny_train(dir, "--set train.steps=" + std::to_string(steps) + " " + extra), kTimeout);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  char name[64];
  std::snprintf(name, sizeof(name), "/ck/step_%06d.safetensors", steps);
  return dir + name;
}

}  // namespace ft::guard_test

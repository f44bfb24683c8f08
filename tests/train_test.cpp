// End-to-end training tests: the loss falls below what byte frequencies alone explain, a
// resumed run is bitwise the same as an uninterrupted one, and (through the CLI) a run's history
// survives resuming, a second run and an interrupt.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "app/training/trainer.h"
#include "core/check.h"
#include "core/text_data.h"
#include "tests/run_command.h"

namespace ft {
namespace {

std::string source_path(const std::string& relative) {
  return std::string(FT_SOURCE_DIR) + "/" + relative;
}

Config tiny_gpt_config(const std::vector<std::string>& extra) {
  std::vector<std::string> overrides = {"data.path=" + source_path("data/moby_dick.txt"),
                                        "train.threads=1"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return load_config(source_path("configs/gpt_tiny.yaml"), overrides);
}

TEST(TrainSmoke, GptTinyBeatsUnigramEntropy) {
  const Config config = tiny_gpt_config({});
  const TextDataset text = TextDataset::load(config.data.path, config.data.val_fraction);
  // A model that learned nothing beyond byte frequencies has a loss of the unigram entropy.
  const double unigram_nats =
      unigram_entropy_bits(text.val_bytes(), text.val_size()) * std::log(2.0);
  Trainer trainer(config, nullptr);
  const double initial = trainer.evaluate(20).loss;
  while (trainer.step() < config.train.steps) trainer.train_step();
  const EvalResult result = trainer.evaluate(0);
  std::printf("unigram %.4f nats, initial val loss %.4f, final val loss %.4f over %lld windows\n",
              unigram_nats, initial, result.loss, static_cast<long long>(result.examples));
  EXPECT_NEAR(initial, std::log(256.0), 0.1) << "an untrained model predicts ~uniform bytes";
  // 0.5 nats below unigram needs context: a wrong attention or MLP backward stalls above it.
  EXPECT_LT(result.loss, unigram_nats - 0.5);
}

std::vector<float> run_steps(Trainer& trainer, int steps) {
  std::vector<float> losses;
  for (int i = 0; i < steps; ++i) losses.push_back(trainer.train_step().loss);
  return losses;
}

TEST(Resume, GptLossesAndParamsAreBitwiseEqual) {
  const std::string dir = ::testing::TempDir() + "/ft_resume";
  std::filesystem::create_directories(dir);
  const std::vector<std::string> shape = {
      "model.n_layer=2",      "model.d_model=32", "model.n_head=2",    "model.dropout=0.1",
      "optim.warmup_steps=2", "train.steps=12",   "train.batch_size=4"};
  Trainer straight(tiny_gpt_config(shape), nullptr);
  const std::vector<float> straight_losses = run_steps(straight, 12);

  Trainer first_half(tiny_gpt_config(shape), nullptr);
  std::vector<float> resumed_losses = run_steps(first_half, 5);
  first_half.save_checkpoint(dir + "/half.safetensors");
  std::vector<std::string> resume = shape;
  resume.push_back("train.resume=" + dir + "/half.safetensors");
  Trainer second_half(tiny_gpt_config(resume), nullptr);
  EXPECT_EQ(second_half.step(), 5);
  for (float loss : run_steps(second_half, 7)) resumed_losses.push_back(loss);

  ASSERT_EQ(straight_losses.size(), resumed_losses.size());
  for (size_t i = 0; i < straight_losses.size(); ++i)
    EXPECT_EQ(straight_losses[i], resumed_losses[i]) << "step " << i + 1;
  const Tensor& a = straight.params().flat_values();
  const Tensor& b = second_half.params().flat_values();
  ASSERT_EQ(a.numel(), b.numel());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.bytes()), 0) << "parameters differ after resume";
}

TEST(Resume, CheckpointOfAnotherShapeIsAClearError) {
  const std::string dir = ::testing::TempDir() + "/ft_resume_shape";
  std::filesystem::create_directories(dir);
  Trainer small(tiny_gpt_config({"model.n_layer=1", "model.d_model=32", "model.n_head=2"}),
                nullptr);
  small.save_checkpoint(dir + "/small.safetensors");
  try {
    Trainer other(tiny_gpt_config({"model.n_layer=1", "model.d_model=64", "model.n_head=2",
                                   "train.resume=" + dir + "/small.safetensors"}),
                  nullptr);
    FAIL() << "loading a mis-shaped checkpoint must throw";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("has shape"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace ft

namespace ft {
namespace {

TEST(TrainSmoke, Resnet8BeatsEightyPercentOnFashionMnist) {
  // The bar: > 80% test accuracy within at most 600 steps of batch 64. CI evaluates the
  // first 2000 test images to stay short.
  const Config config =
      load_config(source_path("configs/resnet8.yaml"), {"train.threads=1", "data.test_limit=2000"});
  ASSERT_LE(config.train.steps, 600);
  ASSERT_EQ(config.train.batch_size, 64);
  Trainer trainer(config, nullptr);
  while (trainer.step() < config.train.steps) trainer.train_step();
  const EvalResult result = trainer.evaluate(0);
  std::printf("resnet8 after %d steps: test accuracy %.4f, loss %.4f on %lld images\n",
              trainer.step(), result.accuracy, result.loss,
              static_cast<long long>(result.examples));
  EXPECT_EQ(result.examples, 2000);
  EXPECT_GT(result.accuracy, 0.80);
}

}  // namespace
}  // namespace ft

// ---- Run history through the CLI: resume, a second run into the same dir, default names, signals.
namespace ft {
namespace {

namespace fs = std::filesystem;
using test::RunResult;

// A fresh directory per test (ctest runs every test as its own process, in parallel).
std::string fresh_dir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/history_" + std::to_string(getpid()) + "_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// The tiny GPT's flags with absolute paths, so that it runs from any working directory.
std::string tiny_flags(const std::string& extra) {
  return std::string(FT_BINARY) + " train --config " + source_path("configs/gpt_tiny.yaml") +
         " --set data.path=" + source_path("data/moby_dick.txt") +
         " --set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 "
         "--set model.seq_len=16 --set train.batch_size=2 --set train.threads=1 "
         "--set train.eval_every=0 --set train.eval_batches=1 --set optim.warmup_steps=0 " +
         extra;
}

RunResult train_in(const std::string& dir, const std::string& extra) {
  return test::run_shell("timeout 60 " + tiny_flags("--set train.run_dir=" + dir + " " + extra));
}

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<int> step_rows(const std::string& metrics) {
  std::vector<int> steps;
  std::istringstream in(text_of(metrics));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    if (row["type"] == "step") steps.push_back(row["step"].get<int>());
  }
  return steps;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(RunHistory, ResumeAppendsMetricsAndKeepsTheFirstConfig) {
  const std::string dir = fresh_dir("resume");
  ASSERT_EQ(train_in(dir, "--set train.steps=4").exit_code, 0);
  const std::string first_config = text_of(dir + "/config.yaml");
  const RunResult resumed = train_in(dir, "--set train.steps=6 --set train.resume=" + dir +
                                              "/checkpoints/step_000004.safetensors");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(step_rows(dir + "/metrics.jsonl"), (std::vector<int>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(text_of(dir + "/config.yaml"), first_config) << "the run's first config was replaced";
  EXPECT_TRUE(has(text_of(dir + "/config.resume-4.yaml"), "steps: 6")) << resumed.output;
  EXPECT_TRUE(has(resumed.output, "(config.resume-4.yaml, log.txt, metrics.jsonl)"))
      << resumed.output;
}

TEST(RunHistory, FreshRunRefusesARunDirWithAnotherRunsHistory) {
  const std::string dir = fresh_dir("fresh");
  ASSERT_EQ(train_in(dir, "--set train.steps=2 --set train.checkpoint_dir=" + dir + "/a").exit_code,
            0);
  const std::string metrics = text_of(dir + "/metrics.jsonl");
  const RunResult again =
      train_in(dir, "--set train.steps=3 --set train.checkpoint_dir=" + dir + "/b");
  EXPECT_NE(again.exit_code, 0) << again.output;
  EXPECT_TRUE(has(again.output, "train.run_dir '" + dir +
                                    "' already holds another run's files "
                                    "(config.yaml, metrics.jsonl)"))
      << again.output;
  EXPECT_TRUE(has(again.output, "choose another train.run_dir")) << again.output;
  EXPECT_TRUE(has(again.output, "train.overwrite: true")) << again.output;
  EXPECT_EQ(text_of(dir + "/metrics.jsonl"), metrics) << "the refused run wrote metrics.jsonl";
  EXPECT_FALSE(fs::exists(dir + "/b"));
  const RunResult forced = train_in(
      dir,
      "--set train.steps=3 --set train.overwrite=true --set train.checkpoint_dir=" + dir + "/b");
  EXPECT_EQ(forced.exit_code, 0) << forced.output;
  EXPECT_EQ(step_rows(dir + "/metrics.jsonl"), (std::vector<int>{1, 2, 3}));
}

// The line "run dir PATH (" of a run's start.
std::string run_dir_of(const std::string& output) {
  const size_t start = output.find("run dir ");
  if (start == std::string::npos) return "";
  return output.substr(start + 8, output.find(" (", start) - start - 8);
}

TEST(RunHistory, DefaultRunDirsAreUniqueWithinASecond) {
  const std::string dir = fresh_dir("default");
  // Every name the next seconds can give is taken: the run must add -2.
  std::vector<std::string> taken;
  for (std::time_t t = std::time(nullptr), end = t + 30; t <= end; ++t) {
    char stamp[32];
    std::tm local{};
    localtime_r(&t, &local);
    std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &local);
    taken.push_back(std::string("runs/gpt_tiny-") + stamp);
    fs::create_directories(dir + "/" + taken.back());
  }
  const std::string cd = "cd " + dir + " && timeout 60 ";
  const RunResult one = test::run_shell(cd + tiny_flags("--set train.steps=1"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::string name = run_dir_of(one.output);
  EXPECT_EQ(name.substr(name.size() - 2), "-2") << one.output;
  EXPECT_TRUE(fs::exists(dir + "/" + name + "/config.yaml")) << one.output;
  for (const std::string& empty : taken) EXPECT_TRUE(fs::is_empty(dir + "/" + empty)) << empty;
  // Three runs started together: three run dirs.
  const RunResult three = test::run_shell(cd + "sh -c '" + tiny_flags("--set train.steps=1") +
                                          " & " + tiny_flags("--set train.steps=1") + " & " +
                                          tiny_flags("--set train.steps=1") + " & wait'");
  std::set<std::string> names;
  for (size_t at = 0; (at = three.output.find("run dir ", at)) != std::string::npos; ++at)
    names.insert(run_dir_of(three.output.substr(at)));
  EXPECT_EQ(names.size(), 3u) << three.output;
}

// runs/latest is the user's file, not our symlink: left alone, and the run says so.
TEST(RunHistory, LatestThatIsNotASymlinkIsLeftAloneWithANote) {
  const std::string dir = fresh_dir("latest");
  fs::create_directories(dir + "/runs");
  std::ofstream(dir + "/runs/latest") << "mine\n";
  const RunResult run =
      test::run_shell("cd " + dir + " && timeout 60 " + tiny_flags("--set train.steps=1"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("note: runs/latest is not a symlink"), std::string::npos) << run.output;
  EXPECT_FALSE(fs::is_symlink(dir + "/runs/latest"));
}

}  // namespace
}  // namespace ft

// End-to-end training tests: the loss falls below what byte frequencies alone explain, and a
// resumed run is bitwise the same as an uninterrupted one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "app/trainer.h"
#include "core/check.h"
#include "core/text_data.h"

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

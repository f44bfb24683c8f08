// "Training must never destroy good work" when loading, through the CLI: eval and resume check a
// checkpoint's tensor values (finite, and not overflowing the forward), its tensor names and its
// architecture. Split from tests/guard_test.cpp; the shared helpers are in tests/guard_test_util.h.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "core/safetensors.h"
#include "tests/guard_test_util.h"
#include "tests/run_command.h"

namespace ft {
namespace {

using namespace guard_test;  // the helpers of tests/guard_test_util.h

TEST(GuardLoad, NonFiniteTensorIsAnErrorNamingTensorAndFile) {
  const std::string dir = fresh_dir("load_nan");
  const std::string good = trained_checkpoint(dir);
  for (float bad_value :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    SafetensorsFile file = load_safetensors(good);
    file.tensors.at("h.0.mlp.c_fc.weight").data[5] = bad_value;
    const std::string bad = dir + "/bad.safetensors";
    save_safetensors(bad, file);
    const RunResult eval = run_fusiontrain("eval --checkpoint " + bad, kTimeout);
    EXPECT_NE(eval.exit_code, 0) << eval.output;
    EXPECT_TRUE(contains(eval.output, bad + ": tensor 'h.0.mlp.c_fc.weight' holds a non-finite"))
        << eval.output;
    const RunResult resume = run_fusiontrain(
        tiny_train(dir + "/r", "--set train.steps=5 --set train.resume=" + bad), kTimeout);
    EXPECT_NE(resume.exit_code, 0) << resume.output;
    EXPECT_TRUE(contains(resume.output, "tensor 'h.0.mlp.c_fc.weight' holds a non-finite"))
        << resume.output;
  }
}

// Weights that are finite but so large that the forward overflows: eval prints the nan loss and
// exits non-zero.
TEST(GuardLoad, EvalOfAModelThatOverflowsIsAnError) {
  const std::string dir = fresh_dir("load_overflow");
  SafetensorsFile file = load_safetensors(trained_checkpoint(dir));
  for (float& weight : file.tensors.at("wte.weight").data) weight = weight < 0 ? -3e38f : 3e38f;
  const std::string huge = dir + "/huge.safetensors";
  save_safetensors(huge, file);
  const RunResult eval = run_fusiontrain("eval --checkpoint " + huge, kTimeout);
  EXPECT_NE(eval.exit_code, 0) << eval.output;
  EXPECT_TRUE(contains(eval.output, "eval: the loss of " + huge)) << eval.output;
  EXPECT_TRUE(contains(eval.output, "the model overflows")) << eval.output;
}

TEST(GuardLoad, ExtraTensorsAreListed) {
  const std::string dir = fresh_dir("extra");
  const std::string two_layers = trained_checkpoint(dir, 3, "--set model.n_layer=2");
  // A config of another size is named first (its embedded config says so) ...
  const RunResult named =
      run_fusiontrain("eval --checkpoint " + two_layers + " --set model.n_layer=1", kTimeout);
  EXPECT_NE(named.exit_code, 0) << named.output;
  EXPECT_TRUE(contains(named.output,
                       "holds a model with model.n_layer '2', but --set says "
                       "model.n_layer '1'"))
      << named.output;
  // ... and without an embedded config the tensors the model lacks are listed.
  SafetensorsFile file = load_safetensors(two_layers);
  file.metadata.erase("config");
  const std::string bare = dir + "/bare.safetensors";
  save_safetensors(bare, file);
  const RunResult eval =
      run_fusiontrain("eval --checkpoint " + bare +
                          " --config configs/gpt_tiny.yaml --set model.n_layer=1 "
                          "--set model.d_model=16 --set model.n_head=2 --set model.seq_len=16",
                      kTimeout);
  EXPECT_NE(eval.exit_code, 0) << eval.output;
  EXPECT_TRUE(contains(eval.output, "the model does not have")) << eval.output;
  EXPECT_TRUE(contains(eval.output, "h.1.mlp.c_fc.weight")) << eval.output;
  EXPECT_TRUE(contains(eval.output, "h.1.ln_1.weight")) << eval.output;
  EXPECT_FALSE(contains(eval.output, "h.0.")) << eval.output;
  EXPECT_FALSE(contains(eval.output, "optim.exp_avg.h.0")) << "state of known params is fine";
  const RunResult same = run_fusiontrain("eval --checkpoint " + two_layers, kTimeout);
  EXPECT_EQ(same.exit_code, 0) << same.output;
}

TEST(GuardLoad, EvalWithAConfigOfAnotherArchSaysSoFirst) {
  const std::string dir = fresh_dir("arch");
  const std::string gpt = trained_checkpoint(dir);
  const RunResult eval =
      run_fusiontrain("eval --checkpoint " + gpt + " --config configs/resnet8.yaml", kTimeout);
  EXPECT_NE(eval.exit_code, 0) << eval.output;
  EXPECT_TRUE(contains(eval.output, "the checkpoint is a 'gpt' model")) << eval.output;
  EXPECT_TRUE(contains(eval.output, "model.arch 'resnet'")) << eval.output;
  EXPECT_FALSE(contains(eval.output, "has no tensor")) << eval.output;
}

// Resuming a GPT checkpoint in a ResNet run names both archs, not the optimizer state that differs.
TEST(GuardLoad, ResumeOfAnotherArchSaysSoFirst) {
  const std::string dir = fresh_dir("resume_arch");
  const std::string gpt = trained_checkpoint(dir);
  const RunResult resume = run_fusiontrain(
      "train --config configs/resnet8.yaml --set train.steps=3 --set optim.warmup_steps=0 "
      "--set train.threads=1 --set train.run_dir=" +
          dir + "/resnet --set train.resume=" + gpt,
      kTimeout);
  EXPECT_NE(resume.exit_code, 0) << resume.output;
  EXPECT_TRUE(contains(resume.output, gpt + ": train.resume: the checkpoint is a 'gpt' model"))
      << resume.output;
  EXPECT_TRUE(contains(resume.output, "this run's model.arch is 'resnet'")) << resume.output;
  EXPECT_FALSE(contains(resume.output, "written by optimizer")) << resume.output;
}

}  // namespace
}  // namespace ft

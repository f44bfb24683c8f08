// `fusiontrain sample` end to end: a tiny GPT trained for a few steps through the binary, then
// sampled: a seed repeats its text, the inference.* keys are the defaults of the flags, the KV
// cache and the recompute path agree, the JSON holds the text and timings, and bad flags, the
// removed inference.checkpoint key and a ResNet checkpoint are refused with messages that name what
// is wrong; so is resuming the suite's AdamW checkpoint with SGD.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "run_command.h"

namespace {

using ft::test::RunResult;

RunResult run(const std::string& args) {
  return ft::test::run_fusiontrain(args, 120);
}

class SampleBinary : public ::testing::Test {
 protected:
  // One tiny GPT (seq_len 16) and one tiny ResNet checkpoint for every test of the suite.
  static void SetUpTestSuite() {
    // ctest runs each test of the suite as its own process, in parallel: one directory each.
    dir_ = ::testing::TempDir() + "/ft_sample_" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    const RunResult gpt = run(
        "train --config configs/gpt_tiny.yaml --set model.n_layer=1 --set model.d_model=16 "
        "--set model.n_head=2 --set model.seq_len=16 --set train.batch_size=2 --set train.steps=3 "
        "--set optim.warmup_steps=0 --set train.threads=1 --set train.run_dir=" +
        dir_ + "/gpt --set train.checkpoint_dir=" + dir_ + "/gpt/ck");
    ASSERT_EQ(gpt.exit_code, 0) << gpt.output;
    const RunResult resnet =
        run("train --config configs/resnet8.yaml --set train.steps=1 --set optim.warmup_steps=0 "
            "--set train.batch_size=2 --set data.test_limit=4 --set train.threads=1 "
            "--set train.run_dir=" +
            dir_ + "/resnet --set train.checkpoint_dir=" + dir_ + "/resnet/ck");
    ASSERT_EQ(resnet.exit_code, 0) << resnet.output;
  }

  static std::string gpt_checkpoint() { return dir_ + "/gpt/ck/step_000003.safetensors"; }
  static std::string resnet_checkpoint() { return dir_ + "/resnet/ck/step_000001.safetensors"; }

  // `sample` on the tiny GPT at one thread, checked to succeed; returns its whole output.
  static std::string sample(const std::string& flags) {
    const RunResult result =
        run("sample --checkpoint " + gpt_checkpoint() + " --set train.threads=1 " + flags);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return result.output;
  }

  // The printed text: everything before the summary line (which holds timings).
  static std::string text_of(const std::string& output) {
    const size_t summary = output.rfind("\nsample: ");
    EXPECT_NE(summary, std::string::npos) << output;
    return output.substr(0, summary);
  }

  static nlohmann::json sample_json(const std::string& flags, const std::string& name) {
    const std::string path = dir_ + "/" + name + ".json";
    std::remove(path.c_str());
    sample(flags + " --json " + path);
    std::ifstream file(path);
    return nlohmann::json::parse(file);  // throws on a missing or malformed file
  }

  static std::string dir_;
};

std::string SampleBinary::dir_;

TEST_F(SampleBinary, SameSeedSameTextOtherSeedOtherText) {
  const std::string flags = "--prompt 'Call me' --max-new-tokens 60 --seed ";
  const std::string first = text_of(sample(flags + "5"));
  EXPECT_EQ(first, text_of(sample(flags + "5")));
  EXPECT_NE(first, text_of(sample(flags + "6")));
  EXPECT_EQ(first.rfind("Call me", 0), 0u) << "the text starts with the prompt: " << first;
}

TEST_F(SampleBinary, JsonHoldsTextSettingsAndTimings) {
  const nlohmann::json json =
      sample_json("--prompt 'Ahab' --max-new-tokens 40 --temperature 0.7 --top-k 5 --seed 3", "a");
  EXPECT_EQ(json["type"], "sample");
  EXPECT_EQ(json["prompt"], "Ahab");
  EXPECT_EQ(json["new_tokens"].size(), 40u);
  EXPECT_EQ(json["settings"]["max_new_tokens"], 40);
  EXPECT_EQ(json["settings"]["top_k"], 5);
  EXPECT_EQ(json["settings"]["seed"], 3);
  EXPECT_NEAR(json["settings"]["temperature"].get<double>(), 0.7, 1e-6);
  EXPECT_EQ(json["settings"]["seq_len"], 16);
  EXPECT_TRUE(json["settings"]["kv_cache"].get<bool>());
  EXPECT_GT(json["kv_cache"]["tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(json["kv_cache"]["reprimes"].get<int>(), 0) << "44 bytes must cross seq_len 16";
  EXPECT_FALSE(json.contains("no_kv_cache"));
}

TEST_F(SampleBinary, InferenceKeysAreTheDefaultsAndAnEmptyPromptIsANewline) {
  const nlohmann::json json = sample_json(
      "--prompt '' --set inference.max_new_tokens=7 --set inference.top_k=1 --seed 4", "b");
  EXPECT_EQ(json["prompt"], "\n");
  EXPECT_EQ(json["new_tokens"].size(), 7u);
  EXPECT_EQ(json["settings"]["top_k"], 1);
  // top_k 1 leaves only the argmax, so it writes the greedy text whatever the seed.
  const nlohmann::json greedy =
      sample_json("--prompt '' --max-new-tokens 7 --temperature 0 --seed 9", "c");
  EXPECT_EQ(json["new_tokens"], greedy["new_tokens"]);
}

TEST_F(SampleBinary, KvCacheAndNoCacheWriteTheSameText) {
  const std::string flags = "--prompt 'The whale' --max-new-tokens 50 --temperature 0 ";
  const std::string output = sample(flags + "--compare-no-cache");
  EXPECT_NE(output.find("same text"), std::string::npos) << output;
  EXPECT_NE(output.find("KV cache speedup"), std::string::npos) << output;
  const std::string no_cache = sample(flags + "--no-kv-cache");
  EXPECT_NE(no_cache.find("without the KV cache"), std::string::npos) << no_cache;
  EXPECT_EQ(text_of(output), text_of(no_cache));
  const nlohmann::json json = sample_json(flags + "--compare-no-cache", "d");
  EXPECT_TRUE(json["same_text"].get<bool>());
  EXPECT_GT(json["no_kv_cache"]["positions_computed"].get<int>(),
            json["kv_cache"]["positions_computed"].get<int>());
}

void expect_refused(const RunResult& result, const std::string& needle) {
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_LT(result.exit_code, 124) << "timed out or crashed: " << result.output;
  EXPECT_NE(result.output.find(needle), std::string::npos)
      << "expected '" << needle << "' in: " << result.output;
  EXPECT_EQ(result.output.find(".cpp:"), std::string::npos)
      << "a user error must not name a source file: " << result.output;
}

TEST_F(SampleBinary, BadFlagsAreRefusedNamingTheFlag) {
  const std::string base = "sample --checkpoint " + gpt_checkpoint() + " ";
  expect_refused(run(base + "--temperature -1"), "--temperature");
  expect_refused(run(base + "--top-k -1"), "--top-k");
  expect_refused(run(base + "--top-k 257"),
                 "--top-k = 257: inference.top_k must not exceed model.vocab_size = 256");
  expect_refused(run(base + "--max-new-tokens 0"), "--max-new-tokens");
  // The key's range says so when the config is read, as the flag's does.
  expect_refused(run(base + "--set inference.max_new_tokens=0"),
                 "--set 'inference.max_new_tokens=0': inference.max_new_tokens: expected an "
                 "integer in [1, 1000000], got 0");
  expect_refused(run(base + "--no-kv-cache --compare-no-cache"), "--compare-no-cache");
  expect_refused(run("sample"), "--checkpoint");
}

// A prompt longer than seq_len conditions on its last seq_len bytes (nanoGPT crops to block_size),
// with a note; the printed text still starts with the whole prompt.
TEST_F(SampleBinary, LongPromptIsCroppedToItsLastSeqLenBytes) {
  const std::string flags = "--max-new-tokens 8 --temperature 0 --prompt ";
  const std::string output = sample(flags + "'seventeen bytes!!'");
  EXPECT_NE(output.find("note: --prompt is 17 bytes; the model's context holds model.seq_len = 16"),
            std::string::npos)
      << output;
  const nlohmann::json cropped = sample_json(flags + "'seventeen bytes!!'", "long");
  const nlohmann::json last = sample_json(flags + "'eventeen bytes!!'", "last");
  EXPECT_EQ(cropped["prompt"], "seventeen bytes!!");
  EXPECT_EQ(cropped["text"].get<std::string>().rfind("seventeen bytes!!", 0), 0u) << cropped;
  EXPECT_EQ(cropped["prompt_in_context"], "eventeen bytes!!");
  EXPECT_EQ(cropped["new_tokens"], last["new_tokens"]) << "greedy from the same 16 bytes";
}

// The checkpoint is --checkpoint only: the key that once named it is refused, not ignored.
TEST_F(SampleBinary, InferenceCheckpointKeyIsRefused) {
  expect_refused(run("sample --checkpoint " + gpt_checkpoint() +
                     " --set inference.checkpoint=" + resnet_checkpoint()),
                 "inference.checkpoint was removed: pass the checkpoint with --checkpoint FILE");
}

// Resuming the AdamW checkpoint with SGD names both optimizers, not one missing tensor. Here, not
// in train_test, because this suite already has a trained AdamW checkpoint.
TEST_F(SampleBinary, ResumeWithAnotherOptimizerNamesBoth) {
  const RunResult result = run(
      "train --config configs/gpt_tiny.yaml --set model.n_layer=1 --set model.d_model=16 "
      "--set model.n_head=2 --set model.seq_len=16 --set train.batch_size=2 --set train.steps=4 "
      "--set optim.warmup_steps=0 --set train.threads=1 --set optim.name=sgd --set train.run_dir=" +
      dir_ + "/resume --set train.resume=" + gpt_checkpoint());
  expect_refused(result, gpt_checkpoint() +
                             ": checkpoint was written by optimizer adamw (it holds "
                             "optim.exp_avg.*, optim.exp_avg_sq.*), but this run's optim.name = "
                             "sgd needs optim.momentum_buffer.*; resume with the optimizer it was "
                             "trained with (optim.name adamw)");
}

TEST_F(SampleBinary, ResnetCheckpointIsRefused) {
  expect_refused(run("sample --checkpoint " + resnet_checkpoint()),
                 "sample needs a GPT checkpoint; model.arch is resnet");
}

}  // namespace

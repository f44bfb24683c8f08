// Tests for the strict YAML config's rules across fields: cross-field checks, keys that only the
// other model.arch or optim.name reads, how resolved dumps count ignored keys, and the removed
// inference.checkpoint. Split from tests/config_test.cpp; shared helpers in
// tests/config_test_util.h.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "core/check.h"
#include "tests/config_test_util.h"

namespace ft {
namespace {

using config_test::kSource;
using config_test::parse_error;

TEST(Config, CrossFieldChecks) {
  const std::string heads = parse_error("model:\n  d_model: 100\n  n_head: 3\n");
  EXPECT_NE(
      heads.find("model.d_model = 100 (test.yaml:2:12) must be divisible by model.n_head = 3"),
      std::string::npos)
      << heads;
  EXPECT_NE(parse_error("model: {}\n", {"model.d_model=130"}).find("--set 'model.d_model=130'"),
            std::string::npos);
  // A resnet does not read the gpt keys, so it refuses them instead of checking them.
  EXPECT_NE(parse_error("model:\n  arch: resnet\n  d_model: 100\n  n_head: 3\n").find("no effect"),
            std::string::npos);
  EXPECT_NE(parse_error("model:\n  vocab_size: 512\n").find("must be 256"), std::string::npos);
  EXPECT_NE(parse_error("model:\n  seq_len: 1\n").find("at least 2"), std::string::npos);
  // A defaulted warmup is clamped to a short run (values_test covers the note); a set one is not.
  EXPECT_NO_THROW(parse_config("train:\n  steps: 10\n", "short.yaml"));
  EXPECT_NE(
      parse_error("train:\n  steps: 10\noptim:\n  warmup_steps: 20\n").find("optim.warmup_steps"),
      std::string::npos);
  // A resolved dump's warmup (fitted or defaulted by the run that wrote it) is clamped too, so a
  // run's config.yaml can be reused for a shorter run; a --set warmup is not.
  Config six_steps;
  six_steps.train.steps = six_steps.optim.warmup_steps = 6;
  const std::string dump = config_to_yaml(six_steps);
  EXPECT_EQ(parse_config(dump, "run/config.yaml", {"train.steps=3"}).optim.warmup_steps, 3);
  EXPECT_THROW(parse_config(dump, "run/config.yaml", {"train.steps=3", "optim.warmup_steps=6"}),
               Error);
  EXPECT_NE(parse_error("optim:\n  min_lr: 0.01\n").find("optim.min_lr"), std::string::npos);
  EXPECT_NE(parse_error("comm:\n  first_bucket_mb: 8\n").find("comm.bucket_mb"), std::string::npos);
  EXPECT_NE(parse_error("data:\n  augment: flip\n").find("only to model.arch resnet"),
            std::string::npos);
  EXPECT_NE(parse_error("comm:\n  backend: nccl\n").find("train.device = cuda"), std::string::npos);
  const std::string latency = parse_error("comm:\n  emulate:\n    latency_us: 20\n");
  EXPECT_NE(latency.find("bandwidth 0 turns emulation off"), std::string::npos) << latency;
  EXPECT_NO_THROW(parse_config("comm:\n  emulate:\n    bandwidth_gbps: 5\n", "bw.yaml"));
}

// Every key only one architecture reads, found by reading app/training/task.cpp,
// app/jobs/sample_job.cpp, app/inference/inference_model.cpp and model/: set under the other one,
// whatever the value (here the default), it is refused naming the key, where it was set and
// model.arch.
TEST(Config, KeysOfTheOtherArchAreRefused) {
  const std::map<std::string, std::string> defaults = [] {
    const auto flat = flatten_config(Config{});
    return std::map<std::string, std::string>(flat.begin(), flat.end());
  }();
  const std::vector<std::string> gpt_only = {"model.n_layer",         "model.n_head",
                                             "model.d_model",         "model.seq_len",
                                             "model.vocab_size",      "model.dropout",
                                             "model.qk_norm",         "data.path",
                                             "data.val_fraction",     "inference.max_new_tokens",
                                             "inference.temperature", "inference.top_k"};
  const std::vector<std::string> resnet_only = {
      "model.resnet_blocks", "model.resnet_width", "model.conv_algorithm", "data.augment",
      "data.mnist_dir",      "data.test_limit",    "inference.fold_bn"};
  auto check = [&](const std::string& arch, const std::vector<std::string>& keys,
                   const std::string& reader) {
    for (const std::string& key : keys) {
      const std::string set = key + "=" + defaults.at(key);
      const std::string message = parse_error("model: {arch: " + arch + "}\n", {set});
      EXPECT_NE(
          message.find(key + " = " + defaults.at(key) + " (--set '" + set + "') has no effect"),
          std::string::npos)
          << message;
      EXPECT_NE(message.find("applies only to model.arch " + reader + ", and model.arch = " + arch +
                             " (test.yaml:1:15)"),
                std::string::npos)
          << message;
      EXPECT_NO_THROW(parse_config("model: {arch: " + reader + "}\n", "ok.yaml", {set})) << key;
    }
  };
  check("resnet", gpt_only, "gpt");
  check("gpt", resnet_only, "resnet");
  const std::string in_file = parse_error("model:\n  resnet_width: 32\n");
  EXPECT_NE(in_file.find("model.resnet_width = 32 (test.yaml:2:17) has no effect"),
            std::string::npos)
      << in_file;
  EXPECT_NE(in_file.find("model.arch = gpt (default)"), std::string::npos) << in_file;
}

TEST(Config, KeysOfTheOtherOptimizerAreRefused) {
  for (const char* set : {"optim.momentum=0.5", "optim.nesterov=false"}) {
    const std::string message = parse_error("model: {}\n", {set});
    EXPECT_NE(message.find("applies only to optim.name sgd, and optim.name = adamw (default)"),
              std::string::npos)
        << message;
  }
  for (const char* set : {"optim.beta1=0.8", "optim.beta2=0.95", "optim.eps=1e-6"}) {
    const std::string message = parse_error("optim:\n  name: sgd\n", {set});
    EXPECT_NE(
        message.find("applies only to optim.name adamw, and optim.name = sgd (test.yaml:2:9)"),
        std::string::npos)
        << message;
    EXPECT_NE(message.find(std::string("--set '") + set + "'"), std::string::npos) << message;
  }
  EXPECT_NO_THROW(parse_config("optim: {name: sgd, momentum: 0.5, nesterov: true}\n", "ok.yaml"));
  EXPECT_NO_THROW(parse_config("optim: {beta1: 0.8, beta2: 0.99, eps: 1e-6}\n", "ok.yaml"));
  // PyTorch refuses it too: with momentum 0 the Nesterov step is plain SGD.
  const std::string nesterov = parse_error("optim: {name: sgd, momentum: 0, nesterov: true}\n");
  EXPECT_NE(nesterov.find("optim.nesterov = true (test.yaml:1:43) requires optim.momentum > 0, "
                          "got optim.momentum = 0 (test.yaml:1:30)"),
            std::string::npos)
      << nesterov;
  const std::string skips = parse_error("train: {max_skipped_steps: 3}\n");
  EXPECT_NE(skips.find("applies only to train.nan_policy skip_step, and train.nan_policy = stop"),
            std::string::npos)
      << skips;
  EXPECT_NO_THROW(
      parse_config("train: {nan_policy: skip_step, max_skipped_steps: 3}\n", "ok.yaml"));
}

// A resolved dump (a run's config.yaml, a checkpoint's embedded config, tune's output) lists every
// key, the ignored ones at their defaults; only a changed one is refused there.
TEST(Config, ResolvedDumpsCountOnlyChangedIgnoredKeys) {
  const Config resnet = load_config(kSource + "/configs/resnet8.yaml");
  const std::string dump = config_to_yaml(resnet);
  EXPECT_NO_THROW(parse_config("# fusiontrain tune: all\n" + dump, "tuned.yaml"));
  std::string changed = dump;
  changed.replace(changed.find("  n_layer: 4\n"), 13, "  n_layer: 6\n");
  const std::string message = parse_error(changed);
  EXPECT_NE(message.find("model.n_layer = 6 (test.yaml:"), std::string::npos) << message;
  EXPECT_NE(message.find("applies only to model.arch gpt"), std::string::npos) << message;
  // Without the header it is a hand-written file, where listing a key means setting it.
  const std::string hand_written = dump.substr(dump.find('\n') + 1);
  EXPECT_NE(parse_error(hand_written).find("has no effect"), std::string::npos);
  // An override of a dump is the user's own, whatever the value.
  EXPECT_NE(parse_error(dump, {"model.n_layer=4"}).find("--set 'model.n_layer=4'"),
            std::string::npos);
}

// inference.checkpoint is gone (sample, eval and export take --checkpoint); every dump written
// before lists it empty, which still loads.
TEST(Config, InferenceCheckpointWasRemoved) {
  std::string old_dump = config_to_yaml(Config{});
  old_dump.insert(old_dump.find("inference:\n") + 11, "  checkpoint: \"\"\n");
  EXPECT_EQ(flatten_config(parse_config(old_dump, "old.yaml")), flatten_config(Config{}));
  const std::string in_file = parse_error("inference:\n  checkpoint: ck.safetensors\n");
  EXPECT_NE(in_file.find("test.yaml:2:3: inference.checkpoint was removed: pass the checkpoint "
                         "with --checkpoint FILE"),
            std::string::npos)
      << in_file;
  EXPECT_NE(parse_error("inference:\n  checkpoint: \"\"\n").find("was removed"), std::string::npos);
  const std::string set = parse_error("model: {}\n", {"inference.checkpoint=ck.safetensors"});
  EXPECT_NE(
      set.find("--set 'inference.checkpoint=ck.safetensors': inference.checkpoint was removed"),
      std::string::npos)
      << set;
}

}  // namespace
}  // namespace ft

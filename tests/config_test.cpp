// Tests for the strict YAML config: presets, error messages, overrides, cross-field checks,
// round trips and the generated reference doc.
#include "app/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"

namespace ft {
namespace {

const std::string kSource = FT_SOURCE_DIR;

// The message of the ft::Error that `action` throws; fails the test if it throws none.
template <typename Action>
std::string error_of(Action action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected an ft::Error";
  return "";
}

std::string parse_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { parse_config(yaml, "test.yaml", overrides); });
}

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(Config, MinimalFileGivesDefaults) {
  const Config config = parse_config("model: {}\n", "min.yaml");
  EXPECT_EQ(flatten_config(config), flatten_config(Config{}));
  EXPECT_EQ(config.source_path, "min.yaml");
}

TEST(Config, PresetsParse) {
  const Config tiny = load_config(kSource + "/configs/gpt_tiny.yaml");
  EXPECT_EQ(tiny.model.arch, "gpt");
  EXPECT_EQ(tiny.model.d_model, 128);
  EXPECT_EQ(tiny.train.steps, 300);
  EXPECT_EQ(tiny.source_path, kSource + "/configs/gpt_tiny.yaml");
  const Config small = load_config(kSource + "/configs/gpt_small.yaml");
  EXPECT_EQ(small.model.n_head, 8);
  EXPECT_EQ(small.model.seq_len, 128);
  EXPECT_FLOAT_EQ(small.optim.lr, 6e-4f);
  const Config resnet8 = load_config(kSource + "/configs/resnet8.yaml");
  EXPECT_EQ(resnet8.model.arch, "resnet");
  EXPECT_EQ(resnet8.model.resnet_blocks, 1);
  EXPECT_EQ(resnet8.optim.name, "sgd");
  EXPECT_FLOAT_EQ(resnet8.optim.weight_decay, 5e-4f);
  EXPECT_EQ(resnet8.optim.grad_clip, 0.0f);
  EXPECT_EQ(resnet8.optim.min_lr, 0.0f);
  const Config resnet20 = load_config(kSource + "/configs/resnet20.yaml");
  EXPECT_EQ(resnet20.model.resnet_blocks, 3);
  EXPECT_EQ(resnet20.train.batch_size, 64);
}

// The default config is the default preset's: no key of it is set to something else.
TEST(Config, TinyPresetMatchesDefaults) {
  const Config tiny = load_config(kSource + "/configs/gpt_tiny.yaml");
  EXPECT_EQ(flatten_config(tiny), flatten_config(Config{}));
}

TEST(Config, UnknownKeyNamesLineAndSuggestion) {
  const std::string message = parse_error("model:\n  n_layer: 2\n  n_haed: 4\n");
  EXPECT_NE(message.find("test.yaml:3:3"), std::string::npos) << message;
  EXPECT_NE(message.find("'n_haed'"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean 'n_head'?"), std::string::npos) << message;
  EXPECT_NE(message.find("d_model"), std::string::npos) << message;  // the list of valid keys
}

TEST(Config, UnknownSectionAndMisplacedKey) {
  const std::string section = parse_error("modle:\n  n_layer: 2\n");
  EXPECT_NE(section.find("test.yaml:1:1"), std::string::npos) << section;
  EXPECT_NE(section.find("did you mean 'model'?"), std::string::npos) << section;
  const std::string misplaced = parse_error("train:\n  n_layer: 2\n");
  EXPECT_NE(misplaced.find("'n_layer' belongs in section 'model'"), std::string::npos) << misplaced;
  const std::string fusion = parse_error("fusion:\n  vertical:\n    gemm_epilog: true\n");
  EXPECT_NE(fusion.find("test.yaml:3:5"), std::string::npos) << fusion;
  EXPECT_NE(fusion.find("did you mean 'gemm_epilogue'?"), std::string::npos) << fusion;
  const std::string nested = parse_error("comm:\n  emulate:\n    latency: 3\n");
  EXPECT_NE(nested.find("test.yaml:3:5"), std::string::npos) << nested;
  EXPECT_NE(nested.find("did you mean 'latency_us'?"), std::string::npos) << nested;
}

TEST(Config, WrongTypes) {
  const std::string word = parse_error("model:\n  n_layer: four\n");
  EXPECT_NE(word.find("test.yaml:2:12"), std::string::npos) << word;
  EXPECT_NE(word.find("model.n_layer"), std::string::npos) << word;
  EXPECT_NE(word.find("an integer in [1, 64]"), std::string::npos) << word;
  EXPECT_NE(parse_error("model:\n  n_layer: 4.5\n").find("integer"), std::string::npos);
  EXPECT_NE(parse_error("model:\n  n_layer: \"4\"\n").find("quoted"), std::string::npos);
  EXPECT_NE(parse_error("model:\n  qk_norm: yes\n").find("true or false"), std::string::npos);
  EXPECT_NE(parse_error("optim:\n  lr: [1, 2]\n").find("got a list"), std::string::npos);
  EXPECT_NE(parse_error("optim:\n  lr: nan\n").find("optim.lr"), std::string::npos);
  EXPECT_NE(parse_error("train:\n  seed: -1\n").find("train.seed"), std::string::npos);
  EXPECT_NE(parse_error("train:\n  resume:\n").find("write \"\""), std::string::npos);
  EXPECT_NE(parse_error("model: 3\n").find("must be a map"), std::string::npos);
  EXPECT_NE(parse_error("- model\n").find("top level must be a map"), std::string::npos);
}

TEST(Config, OutOfRangeValues) {
  const std::string zero = parse_error("model:\n  n_layer: 0\n");
  EXPECT_NE(zero.find("test.yaml:2:12"), std::string::npos) << zero;
  EXPECT_NE(zero.find("[1, 64], got 0"), std::string::npos) << zero;
  const std::string dropout = parse_error("model:\n  dropout: 1.5\n");
  EXPECT_NE(dropout.find("[0, 1)"), std::string::npos) << dropout;
  EXPECT_NE(parse_error("model:\n  dropout: 1\n").find("model.dropout"), std::string::npos);
  const std::string lr = parse_error("optim:\n  lr: -0.1\n");
  EXPECT_NE(lr.find("(0, 10]"), std::string::npos) << lr;
  EXPECT_NE(parse_error("model:\n  n_layer: 99999999999\n").find("model.n_layer"),
            std::string::npos);
  EXPECT_NE(parse_error("data:\n  val_fraction: 0.6\n").find("(0, 0.5]"), std::string::npos);
  EXPECT_NE(parse_error("data:\n  path: \"\"\n").find("non-empty"), std::string::npos);
  // Generating nothing is no sample: the key starts at 1, as --max-new-tokens does.
  const std::string tokens = parse_error("inference:\n  max_new_tokens: 0\n");
  EXPECT_NE(tokens.find("test.yaml:2:19: inference.max_new_tokens: expected an integer in [1, "
                        "1000000], got 0"),
            std::string::npos)
      << tokens;
}

TEST(Config, ValueNotInAllowedList) {
  const std::string message = parse_error("optim:\n  name: adam\n");
  EXPECT_NE(message.find("test.yaml:2:9"), std::string::npos) << message;
  EXPECT_NE(message.find("optim.name"), std::string::npos) << message;
  EXPECT_NE(message.find("one of: adamw, sgd"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean 'adamw'?"), std::string::npos) << message;
}

TEST(Config, FileProblems) {
  const std::string missing = error_of([] { load_config("/nonexistent/dir/x.yaml"); });
  EXPECT_NE(missing.find("/nonexistent/dir/x.yaml"), std::string::npos) << missing;
  EXPECT_NE(missing.find("not found"), std::string::npos) << missing;
  const std::string empty_path = write_temp("empty.yaml", "");
  EXPECT_NE(error_of([&] { load_config(empty_path); }).find(empty_path + ": config file is empty"),
            std::string::npos);
  const std::string comments = write_temp("comments.yaml", "# nothing\n\n# here\n");
  EXPECT_NE(error_of([&] { load_config(comments); }).find("empty"), std::string::npos);
  EXPECT_NE(error_of([] { load_config(testing::TempDir()); }).find("directory"), std::string::npos);
  const std::string syntax = parse_error("model:\n  n_layer: [1,\n  d_model: }\n");
  EXPECT_NE(syntax.find("test.yaml:"), std::string::npos) << syntax;
  EXPECT_NE(syntax.find("YAML syntax error"), std::string::npos) << syntax;
  EXPECT_NE(parse_error("model: {}\n---\nmodel: {}\n").find("one YAML document"),
            std::string::npos);
}

TEST(Config, DuplicateKey) {
  const std::string message = parse_error("model:\n  n_layer: 2\n  n_layer: 3\n");
  EXPECT_NE(message.find("test.yaml:3:3"), std::string::npos) << message;
  EXPECT_NE(message.find("duplicate key 'model.n_layer' (first set at line 2)"), std::string::npos)
      << message;
  EXPECT_NE(parse_error("model: {}\nmodel: {}\n").find("duplicate key 'model'"), std::string::npos);
}

TEST(Config, OverridesChangeValues) {
  const Config config = parse_config(
      "model: {}\n", "o.yaml",
      {"model.n_layer=6", "optim.lr=3e-4", "train.resume=", "train.seed=42",
       "comm.emulate.bandwidth_gbps=10", "comm.emulate.latency_us=20", "model.n_layer=8"});
  EXPECT_EQ(config.model.n_layer, 8);  // later overrides win
  EXPECT_FLOAT_EQ(config.optim.lr, 3e-4f);
  EXPECT_EQ(config.train.resume, "");
  EXPECT_EQ(config.train.seed, 42u);
  EXPECT_EQ(config.comm.emulate.bandwidth_gbps, 10.0);
  EXPECT_EQ(config.comm.emulate.latency_us, 20.0);
}

TEST(Config, BadOverrides) {
  const std::string unknown = parse_error("model: {}\n", {"model.n_haed=3"});
  EXPECT_NE(unknown.find("--set 'model.n_haed=3'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("did you mean 'model.n_head'?"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("valid keys in 'model'"), std::string::npos) << unknown;
  const std::string range = parse_error("model: {}\n", {"model.n_layer=0"});
  EXPECT_NE(range.find("--set 'model.n_layer=0': model.n_layer: expected an integer in [1, 64]"),
            std::string::npos)
      << range;
  EXPECT_NE(parse_error("model: {}\n", {"optim.name=adam"}).find("one of: adamw, sgd"),
            std::string::npos);
  EXPECT_NE(parse_error("model: {}\n", {"model.n_layer"}).find("expected section.key=value"),
            std::string::npos);
  EXPECT_NE(parse_error("model: {}\n", {"=3"}).find("expected section.key=value"),
            std::string::npos);
  EXPECT_NE(parse_error("model: {}\n", {"comm.emulate=3"}).find("is a section"), std::string::npos);
  EXPECT_NE(
      parse_error("model: {}\n", {"comm.emulate.latency=3"}).find("'comm.emulate.latency_us'"),
      std::string::npos);
}

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

// Every key only one architecture reads, found by reading app/task.cpp, app/sample_job.cpp,
// app/inference_model.cpp and model/: set under the other one, whatever the value (here the
// default), it is refused naming the key, where it was set and model.arch.
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

TEST(Config, YamlRoundTrip) {
  const Config original =
      parse_config("model: {}\n", "x.yaml",
                   {"train.resume=dir with \"quotes\"\\ and: colon", "optim.eps=1.5e-7",
                    "comm.emulate.latency_us=2.5", "comm.emulate.bandwidth_gbps=0.1",
                    "train.seed=18446744073709551615", "model.dropout=0.1"});
  const std::string yaml = config_to_yaml(original);
  const Config reparsed = parse_config(yaml, "resolved.yaml");
  EXPECT_EQ(flatten_config(reparsed), flatten_config(original)) << yaml;
  EXPECT_EQ(reparsed.train.resume, "dir with \"quotes\"\\ and: colon");
  EXPECT_NE(yaml.find("    latency_us: 2.5\n"), std::string::npos) << yaml;
  for (const char* preset : {"gpt_small", "resnet20"}) {
    const Config config = load_config(kSource + "/configs/" + preset + ".yaml");
    EXPECT_EQ(flatten_config(parse_config(config_to_yaml(config), "p.yaml")),
              flatten_config(config))
        << preset;
  }
}

TEST(Config, FlattenOrderAndText) {
  const auto flat = flatten_config(Config{});
  ASSERT_EQ(flat.size(), 76u);
  EXPECT_EQ(flat.front(), (std::pair<std::string, std::string>{"model.arch", "gpt"}));
  EXPECT_EQ(flat[1], (std::pair<std::string, std::string>{"model.n_layer", "4"}));
  EXPECT_EQ(flat.back(), (std::pair<std::string, std::string>{"inference.fold_bn", "true"}));
  const std::map<std::string, std::string> by_key(flat.begin(), flat.end());
  EXPECT_EQ(by_key.at("optim.lr"), "0.001");
  EXPECT_EQ(by_key.at("optim.eps"), "1e-08");
  EXPECT_EQ(by_key.at("comm.emulate.latency_us"), "0");
  EXPECT_EQ(by_key.at("train.resume"), "");
  EXPECT_EQ(by_key.at("model.conv_algorithm"), "auto");
}

TEST(Config, ReferenceDocMatchesSchema) {
  const std::string path = kSource + "/docs/config_reference.md";
  const std::string generated = config_reference_markdown();
  const char* update = std::getenv("FT_UPDATE_DOCS");
  if (update != nullptr && std::string(update) == "1") std::ofstream(path) << generated;
  EXPECT_EQ(read_file(path), generated) << "docs/config_reference.md is stale; run config_test "
                                           "with FT_UPDATE_DOCS=1 to regenerate it";
  EXPECT_NE(generated.find("| `comm.emulate.latency_us` | float | `0` |"), std::string::npos);
  EXPECT_NE(generated.find("one of: adamw, sgd"), std::string::npos);
}

// The README embeds the same reference (from the "Every key" paragraph on) between markers.
TEST(Config, ReadmeEmbedsTheReference) {
  const std::string readme = read_file(kSource + "/README.md");
  const std::string generated = config_reference_markdown();
  const std::string begin = "<!-- config-reference:begin -->\n";
  const std::string end = "<!-- config-reference:end -->";
  const size_t begin_at = readme.find(begin);
  const size_t end_at = readme.find(end);
  ASSERT_NE(begin_at, std::string::npos) << "README.md lacks " << begin;
  ASSERT_NE(end_at, std::string::npos) << "README.md lacks " << end;
  const std::string embedded =
      readme.substr(begin_at + begin.size(), end_at - begin_at - begin.size());
  EXPECT_EQ(embedded, generated.substr(generated.find("Every key")))
      << "README.md's configuration reference is stale: paste docs/config_reference.md from "
         "'Every key' on between the markers";
}

}  // namespace
}  // namespace ft

// Tests for the strict YAML config: presets, error messages, overrides, round trips and the
// generated reference doc. Rules across fields (cross-field checks, keys of the other arch or
// optimizer, resolved dumps) are in tests/config_rules_test.cpp.
#include "app/config/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "tests/config_test_util.h"

namespace ft {
namespace {
using config_test::error_of;
using config_test::kSource;
using config_test::parse_error;

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
  ASSERT_EQ(flat.size(), 81u);
  EXPECT_EQ(flat.front(), (std::pair<std::string, std::string>{"model.arch", "gpt"}));
  EXPECT_EQ(flat[1], (std::pair<std::string, std::string>{"model.n_layer", "4"}));
  EXPECT_EQ(flat.back(), (std::pair<std::string, std::string>{"inference.fold_bn", "true"}));
  const std::map<std::string, std::string> by_key(flat.begin(), flat.end());
  EXPECT_EQ(by_key.at("optim.lr"), "0.001");
  EXPECT_EQ(by_key.at("optim.eps"), "1e-08");
  EXPECT_EQ(by_key.at("comm.emulate.latency_us"), "0");
  EXPECT_EQ(by_key.at("comm.timeout_s"), "600");
  EXPECT_EQ(by_key.at("comm.single_rank_allreduce"), "false");
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

// The README links the generated reference instead of carrying a copy of it.
TEST(Config, ReadmeLinksTheReference) {
  const std::string readme = read_file(kSource + "/README.md");
  EXPECT_NE(readme.find("](docs/config_reference.md)"), std::string::npos)
      << "README.md should link docs/config_reference.md";
  EXPECT_EQ(readme.find("<!-- config-reference:begin -->"), std::string::npos)
      << "README.md carries a copy of the config reference; link docs/config_reference.md instead";
}

}  // namespace
}  // namespace ft

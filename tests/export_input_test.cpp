// Exports whose metadata or weights lie, and flags that once slipped through: infer refuses an
// export whose image size, channels or classes do not fit the data (an image_size of 1000 once
// crashed in memcpy, 32 read past the batch) or whose weights are not finite; sample --model
// refuses a GPT export whose 'model' metadata is missing, malformed or contradicts its config,
// or whose weights are not finite, without a source path in the message; sample --seed past
// 2^64 - 1 is refused instead of saturated; eval names where a wrong model.arch came from.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "core/safetensors.h"
#include "model/gpt.h"
#include "tests/export_test_util.h"

namespace ft {
namespace {

using namespace export_test;

// A copy of `source` at temp_path(name) with `edit` applied to its contents.
std::string edited_copy(const std::string& source, const std::string& name,
                        const std::function<void(SafetensorsFile&)>& edit) {
  SafetensorsFile file = load_safetensors(source);
  edit(file);
  const std::string path = temp_path(name);
  save_safetensors(path, file);
  return path;
}

void set_model_field(SafetensorsFile& file, const std::string& key, const nlohmann::json& value) {
  nlohmann::json model = nlohmann::json::parse(file.metadata.at("model"));
  model[key] = value;
  file.metadata["model"] = model.dump();
}

TEST(ExportInput, InferRefusesMetadataThatDoesNotFitTheData) {
  for (int image_size : {1000, 32}) {
    const std::string path = edited_copy(
        resnet_export(), "size" + std::to_string(image_size) + ".safetensors",
        [&](SafetensorsFile& file) { set_model_field(file, "image_size", image_size); });
    expect_refused("infer --model " + path + " --limit 8",
                   {path + ": the export's metadata says model.image_size " +
                    std::to_string(image_size) + ", but Fashion-MNIST test set holds 28x28"});
  }
  const std::string channels =
      edited_copy(resnet_export(), "channels.safetensors",
                  [](SafetensorsFile& file) { set_model_field(file, "in_channels", 3); });
  // The stem's weights pin the channels, so that lie is caught as a shape.
  expect_refused("infer --model " + channels + " --limit 8",
                 {"tensor 'conv1.weight' has shape [16, 1, 3, 3], expected [16, 3, 3, 3]"});
}

TEST(ExportInput, InferRefusesNonFiniteWeights) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY}) {
    const std::string path =
        edited_copy(resnet_export(), "nonfinite.safetensors",
                    [&](SafetensorsFile& file) { file.tensors.at("fc.weight").data[3] = bad; });
    expect_refused("infer --model " + path + " --limit 8",
                   {path + ": tensor 'fc.weight' holds a non-finite value", "at element 3"});
  }
}

// Metadata in our words: no library exception text, the key named, a tiny stddev refused.
TEST(ExportInput, InferNamesTheBadMetadataKey) {
  const struct {
    const char* name;
    std::function<void(SafetensorsFile&)> edit;
    std::string expected;
  } cases[] = {
      {"std", [](SafetensorsFile& f) { f.metadata["image_std"] = "1e-45"; },
       "export metadata image_std is 1e-45; it must be a finite number >= 1e-06"},
      {"mean", [](SafetensorsFile& f) { f.metadata["image_mean"] = "\"grey\""; },
       "export metadata image_mean is \"grey\", not a finite number"},
      {"json", [](SafetensorsFile& f) { f.metadata["model"] = "{\"resnet_blocks\": "; },
       "export metadata 'model' is not valid JSON (it breaks at byte"},
      {"field", [](SafetensorsFile& f) { set_model_field(f, "classes", "ten"); },
       "export metadata model.classes is \"ten\", not an integer"},
      {"plan", [](SafetensorsFile& f) { f.metadata["plan"] = "{\"conv\": 5}"; },
       "export metadata 'plan' is not a JSON list"},
      {"entry",
       [](SafetensorsFile& f) {
         nlohmann::json plan = nlohmann::json::parse(f.metadata.at("plan"));
         plan[0]["conv"] = 5;
         f.metadata["plan"] = plan.dump();
       },
       "the export's plan entry {\"conv\":5"},
  };
  for (const auto& c : cases) {
    const std::string path =
        edited_copy(resnet_export(), std::string("meta_") + c.name + ".safetensors", c.edit);
    const test::RunResult result =
        test::run_fusiontrain("infer --model " + path + " --limit 8", 60);
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find(path + ": " + c.expected), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find("json.exception"), std::string::npos) << result.output;
  }
}

// A small GPT's export, made once per process.
const std::string& gpt_export() {
  static const std::string path = [] {
    const Config config = parse_config(
        "model: {arch: gpt, n_layer: 1, n_head: 2, d_model: 16, seq_len: 8}\n", "test");
    ParamStore params;
    register_gpt_params(gpt_shape(config.model), params);
    params.allocate();
    params.initialize(4);
    const std::string checkpoint = temp_path("gpt.ckpt.safetensors");
    fold_test::write_checkpoint(checkpoint, config, params);
    const std::string out = temp_path("gpt.export.safetensors");
    const test::RunResult exported =
        test::run_fusiontrain("export --checkpoint " + checkpoint + " --out " + out, 60);
    EXPECT_EQ(exported.exit_code, 0) << exported.output;
    return out;
  }();
  return path;
}

TEST(ExportInput, SampleChecksAGptExportsModelMetadata) {
  const std::string flags = " --max-new-tokens 4 --prompt a";
  ASSERT_EQ(test::run_fusiontrain("sample --model " + gpt_export() + flags, 60).exit_code, 0);
  struct Case {
    std::string name;
    std::function<void(SafetensorsFile&)> edit;
    std::string expected;
  };
  const Case cases[] = {
      {"missing", [](SafetensorsFile& f) { f.metadata.erase("model"); }, "has no 'model'"},
      {"json", [](SafetensorsFile& f) { f.metadata["model"] = "{n_layer"; }, "not a JSON object"},
      {"array", [](SafetensorsFile& f) { f.metadata["model"] = "[1, 2]"; }, "not a JSON object"},
      {"heads", [](SafetensorsFile& f) { set_model_field(f, "n_head", 0); },
       "model.n_head is 0, but its config says model.n_head: 2"},
      {"vocab", [](SafetensorsFile& f) { set_model_field(f, "vocab_size", 300); },
       "model.vocab_size is 300, but its config says model.vocab_size: 256"},
      {"qk", [](SafetensorsFile& f) { set_model_field(f, "qk_norm", true); },
       "model.qk_norm is true, but its config says model.qk_norm: false"},
      {"seq", [](SafetensorsFile& f) { set_model_field(f, "seq_len", 32); },
       "model.seq_len is 32, but its config says model.seq_len: 8"},
      {"type", [](SafetensorsFile& f) { set_model_field(f, "d_model", "16"); },
       "model.d_model is missing or not an integer"},
      {"nan", [](SafetensorsFile& f) { f.tensors.at("wte.weight").data[0] = NAN; },
       "tensor 'wte.weight' holds a non-finite value"},
  };
  for (const Case& c : cases) {
    const std::string path = edited_copy(gpt_export(), "gpt_" + c.name + ".safetensors", c.edit);
    const test::RunResult result = test::run_fusiontrain("sample --model " + path + flags, 60);
    EXPECT_EQ(result.exit_code, 1) << c.name << ": " << result.output;
    EXPECT_NE(result.output.find(path + ": "), std::string::npos) << result.output;
    EXPECT_NE(result.output.find(c.expected), std::string::npos) << c.name << ": " << result.output;
    EXPECT_EQ(result.output.find(".cpp"), std::string::npos) << result.output;
  }
}

TEST(ExportInput, SampleSeedPastTheLargestIsRefused) {
  const test::RunResult result = test::run_fusiontrain(
      "sample --model " + gpt_export() + " --max-new-tokens 2 --seed 18446744073709551616", 60);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("'18446744073709551616' is out of range"), std::string::npos)
      << result.output;
  EXPECT_EQ(
      test::run_fusiontrain(
          "sample --model " + gpt_export() + " --max-new-tokens 2 --seed 18446744073709551615", 60)
          .exit_code,
      0);
}

// A checkpoint whose metadata says resnet while its embedded config says gpt: no --set was given.
TEST(ExportInput, EvalNamesTheEmbeddedConfigAsTheSourceOfTheArch) {
  const std::string path =
      edited_copy(resnet_checkpoint(), "arch.ckpt.safetensors",
                  [](SafetensorsFile& file) { file.metadata["arch"] = "gpt"; });
  expect_refused("eval --checkpoint " + path,
                 {"the checkpoint is a 'gpt' model (metadata 'arch'), but its embedded config "
                  "(metadata 'config') says model.arch 'resnet'"});
}

// A config of another size or architecture is named as the mistake, before any tensor check
// could say only "no tensor 'wte.weight'" or a shape.
TEST(ExportInput, AConfigOfAnotherModelIsNamedBeforeAnyTensor) {
  const std::string exported = gpt_export();  // and its 1-layer checkpoint
  const std::string checkpoint = temp_path("gpt.ckpt.safetensors");
  const std::string other_size =
      "the checkpoint holds a model with model.n_layer '1', but "
      "--config configs/gpt_tiny.yaml says model.n_layer '4'";
  expect_refused("export --checkpoint " + checkpoint + " --config configs/gpt_tiny.yaml --out " +
                     temp_path("other_size.safetensors"),
                 {other_size});
  expect_refused(
      "sample --checkpoint " + checkpoint + " --config configs/gpt_tiny.yaml --max-new-tokens 2",
      {other_size});
  expect_refused(
      "sample --model " + exported + " --config configs/gpt_tiny.yaml --max-new-tokens 2",
      {"the export holds a model with model.n_layer '1', but --config configs/gpt_tiny.yaml"});
  expect_refused("export --checkpoint " + checkpoint + " --config configs/resnet8.yaml --out " +
                     temp_path("other_arch.safetensors"),
                 {"the checkpoint is a 'gpt' model (metadata 'arch'), but --config "
                  "configs/resnet8.yaml says model.arch 'resnet'"});
}

}  // namespace
}  // namespace ft

namespace ft {
namespace {

// The fuzzer's findings (fuzz/findings): a few hundred bytes whose metadata describes a model of
// 48 or 94 GiB with no tensors to match. Refused before anything is allocated: each runs inside
// a 4 GB address-space limit and names the missing tensor.
TEST(ExportInput, TinyFilesDescribingHugeModelsAreRefusedBeforeAllocating) {
  const std::string findings = std::string(FT_SOURCE_DIR) + "/fuzz/findings/";
  const std::pair<std::string, std::string> cases[] = {
      {"sample --max-new-tokens 2 --model " + findings + "sample_model_allocates_48GiB.safetensors",
       "no tensor 'wte.weight'"},
      {"sample --max-new-tokens 2 --model " + findings + "sample_model_1.8GB_rss.safetensors",
       "no tensor 'wte.weight'"},
      {"eval --checkpoint " + findings + "checkpoint_allocates_48GiB.safetensors",
       "no tensor 'wte.weight'"},
      {"infer --model " + findings + "infer_model_allocates_94GiB.safetensors",
       "export has no tensor 'conv1.weight'"},
  };
  for (const auto& [args, expected] : cases) {
    const test::RunResult result = test::run_shell(
        std::string("cd ") + FT_SOURCE_DIR + " && ulimit -v 4000000 && " + FT_BINARY + " " + args);
    EXPECT_EQ(result.exit_code, 1) << args << ": " << result.output;
    EXPECT_NE(result.output.find(expected), std::string::npos) << args << ": " << result.output;
    EXPECT_EQ(result.output.find("out of host memory"), std::string::npos) << result.output;
  }
}

}  // namespace
}  // namespace ft

// Tests for `fusiontrain export` and `infer` (app/inference/inference_model.h): the export's names
// and metadata read by a plain JSON parser, the export -> infer round trip against the unfolded
// eval model, PyTorch reproducing the logits from the file alone (scripts/load_export.py), GPT
// exports, and clear errors for corrupt, truncated or wrong files and checkpoints without running
// statistics. Checkpoints are written directly (tests/fold_test_util.h), not trained.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/inference/inference_model.h"
#include "app/training/task.h"
#include "core/atomic_file.h"
#include "core/device.h"
#include "model/gpt.h"
#include "tests/export_test_util.h"
#include "tests/fold_test_util.h"
#include "tests/run_command.h"

namespace ft {
namespace {

using test::run_fusiontrain;
using test::run_shell;
using namespace export_test;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
}

nlohmann::json read_header(const std::string& path) {
  const std::string bytes = read_file(path);
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  return nlohmann::json::parse(bytes.substr(8, length));
}

TEST(Export, ResnetHoldsFoldedConvolutionsAndDocumentedMetadata) {
  const nlohmann::json header = read_header(resnet_export());
  for (const char* name :
       {"conv1.weight", "conv1.bias", "layer1.0.conv1.weight", "layer1.0.conv1.bias",
        "layer1.0.conv2.bias", "layer2.0.downsample.0.weight", "layer2.0.downsample.0.bias",
        "fc.weight", "fc.bias"})
    EXPECT_TRUE(header.contains(name)) << name;
  for (const auto& [name, entry] : header.items()) {
    EXPECT_EQ(name.find("bn"), std::string::npos) << name;
    EXPECT_EQ(name.find("optim"), std::string::npos) << name;
    EXPECT_EQ(name.find("running"), std::string::npos) << name;
  }
  const nlohmann::json& metadata = header.at("__metadata__");
  EXPECT_EQ(metadata.at("format"), "fusiontrain-export-1");
  EXPECT_EQ(metadata.at("arch"), "resnet");
  const nlohmann::json model = nlohmann::json::parse(metadata.at("model").get<std::string>());
  EXPECT_EQ(model.at("resnet_width"), 16);
  const nlohmann::json plan = nlohmann::json::parse(metadata.at("plan").get<std::string>());
  ASSERT_EQ(plan.size(), 9u);
  EXPECT_EQ(plan[2].at("conv"), "layer1.0.conv2");
  EXPECT_TRUE(plan[2].at("residual").get<bool>());
  EXPECT_NE(metadata.at("config").get<std::string>().find("resnet"), std::string::npos);
  EXPECT_FLOAT_EQ(std::stof(metadata.at("bn_eps").get<std::string>()), 1e-5f);
  // The recorded digest is the checkpoint's, as sha256sum computes it.
  const test::RunResult sum = run_shell("sha256sum " + resnet_checkpoint());
  EXPECT_EQ(sum.output.substr(0, 64), metadata.at("source_sha256").get<std::string>());
}

TEST(Export, InferMatchesTheUnfoldedEvalModel) {
  const std::string json = temp_path("infer.json");
  const test::RunResult result =
      run_fusiontrain("infer --model " + resnet_export() + " --compare-unfolded " +
                          resnet_checkpoint() + " --limit 96 --batch 32 --threads 1 --json " + json,
                      300);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("accuracy"), std::string::npos) << result.output;
  const nlohmann::json row = nlohmann::json::parse(read_file(json));
  EXPECT_EQ(row.at("images"), 96);
  EXPECT_GT(row.at("images_per_s").get<double>(), 0.0);
  const nlohmann::json& compare = row.at("compare");
  EXPECT_LT(compare.at("max_rel_logit_diff").get<double>(), 1e-4);
  EXPECT_EQ(compare.at("prediction_agreement").get<double>(), 1.0);
}

// --profile: per-kind times of both models over the batches of the full size (96 = 2 x 40 + 16:
// the last batch is left out), ConvBias in the export against conv + BN + ReLU unfolded.
TEST(Export, InferProfileSplitsEachModelByOpKind) {
  const std::string json = temp_path("infer_profile.json");
  const test::RunResult result = run_fusiontrain(
      "infer --model " + resnet_export() + " --compare-unfolded " + resnet_checkpoint() +
          " --limit 96 --batch 40 --threads 1 --profile " + "--json " + json,
      300);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("profile folded: 2 batches"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("profile unfolded: 2 batches"), std::string::npos) << result.output;
  const nlohmann::json row = nlohmann::json::parse(read_file(json));
  auto kinds_of = [](const nlohmann::json& profile) {
    std::map<std::string, int> ops;
    for (const nlohmann::json& kind : profile.at("kinds"))
      ops[kind.at("kind").get<std::string>()] = kind.at("ops").get<int>();
    return ops;
  };
  EXPECT_EQ(row.at("profile").at("steps"), 2);
  const std::map<std::string, int> folded = kinds_of(row.at("profile"));
  const std::map<std::string, int> eager = kinds_of(row.at("compare").at("profile"));
  EXPECT_EQ(folded.at("conv_bias"), eager.at("conv2d")) << "one ConvBias per convolution";
  EXPECT_EQ(folded.count("batchnorm2d_inference"), 0u);
  EXPECT_EQ(folded.count("relu"), 0u);
  EXPECT_EQ(eager.at("batchnorm2d_inference"), eager.at("conv2d"));
  EXPECT_GT(eager.at("relu"), 0);
}

// --device names where the model runs: anything but cpu or cuda is refused by name, and cuda
// without a usable GPU stops before reading data with the reason and what to use instead.
TEST(Export, InferDeviceIsCheckedUpFront) {
  const std::string common = "infer --model " + resnet_export() + " --limit 8";
  const test::RunResult unknown = run_fusiontrain(common + " --device tpu", 60);
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.output.find("infer --device 'tpu' is not a device (allowed: cpu, cuda)"),
            std::string::npos)
      << unknown.output;
  if (!cuda_unusable_reason("infer --device cuda").empty()) {
    const test::RunResult cuda = run_fusiontrain(common + " --device cuda", 60);
    EXPECT_EQ(cuda.exit_code, 1);
    EXPECT_NE(cuda.output.find("infer --device cuda needs "), std::string::npos) << cuda.output;
    EXPECT_NE(cuda.output.find("use --device cpu on this machine"), std::string::npos)
        << cuda.output;
    EXPECT_EQ(cuda.output.find(".cpp"), std::string::npos) << "a source path: " << cuda.output;
  }
  const test::RunResult cpu = run_fusiontrain(common + " --device cpu", 60);
  EXPECT_EQ(cpu.exit_code, 0) << cpu.output;
}

TEST(Export, InferReadsIdxFilesWithAndWithoutLabels) {
  const std::string images = std::string(kFashionMnistDir) + "/t10k-images-idx3-ubyte.gz";
  const std::string labels = std::string(kFashionMnistDir) + "/t10k-labels-idx1-ubyte.gz";
  const std::string common = "infer --model " + resnet_export() + " --limit 16 --data " + images;
  const test::RunResult labelled = run_fusiontrain(common + " --labels " + labels, 120);
  ASSERT_EQ(labelled.exit_code, 0) << labelled.output;
  EXPECT_NE(labelled.output.find("accuracy"), std::string::npos) << labelled.output;
  const test::RunResult unlabelled = run_fusiontrain(common, 120);
  ASSERT_EQ(unlabelled.exit_code, 0) << unlabelled.output;
  EXPECT_EQ(unlabelled.output.find("accuracy"), std::string::npos) << unlabelled.output;
  EXPECT_NE(unlabelled.output.find("images/s"), std::string::npos) << unlabelled.output;
  const test::RunResult missing =
      run_fusiontrain("infer --model " + resnet_export() + " --data /nonexistent/images.idx", 60);
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("/nonexistent/images.idx"), std::string::npos) << missing.output;
}

TEST(Export, PytorchReproducesTheLogitsFromTheFileAlone) {
  if (run_shell(std::string(kPython) + " -c 'import torch, numpy'").exit_code != 0)
    GTEST_SKIP() << "python3-torch is not installed (scripts/bootstrap.sh installs it)";
  const int count = 64;
  ExportedResnet model(resnet_export());
  const Tensor& logits = test_image_logits(model, count);
  const std::string expect = temp_path("logits.f32");
  std::ofstream(expect, std::ios::binary)
      .write(reinterpret_cast<const char*>(logits.data()), logits.bytes());
  const test::RunResult result = run_shell(
      std::string("cd ") + FT_SOURCE_DIR + " && " + kPython + " scripts/load_export.py --export " +
      resnet_export() + " --count " + std::to_string(count) + " --expect " + expect);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("predictions agree 64/64"), std::string::npos) << result.output;
}

TEST(Export, CorruptOrTruncatedExportsGiveClearErrors) {
  const std::string bytes = read_file(resnet_export());
  const std::string truncated = temp_path("truncated.safetensors");
  write_file_atomic(truncated, bytes.substr(0, bytes.size() / 2));
  std::string corrupt_bytes = bytes;
  corrupt_bytes[12] = '#';  // inside the JSON header
  const std::string corrupt = temp_path("corrupt.safetensors");
  write_file_atomic(corrupt, corrupt_bytes);
  for (const std::string& file : {truncated, corrupt}) {
    const test::RunResult result = run_fusiontrain("infer --model " + file + " --limit 8", 60);
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find(file), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find(".cpp"), std::string::npos) << result.output;
  }
  // A checkpoint is not an export.
  const test::RunResult result =
      run_fusiontrain("infer --model " + resnet_checkpoint() + " --limit 8", 60);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.output.find("not a fusiontrain export"), std::string::npos) << result.output;
}

TEST(Export, CheckpointWithoutRunningStatisticsIsRefused) {
  const Config config = resnet_config();
  ParamStore params;
  register_resnet_params(resnet_shape(config.model), params);
  params.allocate();
  params.initialize(3);
  const std::string path = temp_path("no_stats.safetensors");
  fold_test::write_checkpoint(path, config, params, /*with_buffers=*/false);
  const test::RunResult result = run_fusiontrain(
      "export --checkpoint " + path + " --out " + temp_path("never.safetensors"), 60);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.output.find("running statistics"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("bn1.running_mean"), std::string::npos) << result.output;
  EXPECT_NE(run_shell("test -e " + temp_path("never.safetensors")).exit_code, 0);
}

// An export always folds BatchNorm (it holds no BN tensors), so fold_bn false, from a flag or from
// the checkpoint's own config, is refused instead of ignored; --set inference.fold_bn=true exports.
TEST(Export, FoldBnFalseIsRefusedNamingWhereItWasSet) {
  const std::string out = temp_path("fold_bn_false.safetensors");
  const test::RunResult flag =
      run_fusiontrain("export --checkpoint " + resnet_checkpoint() + " --out " + out +
                          " --set inference.fold_bn=false",
                      60);
  EXPECT_EQ(flag.exit_code, 1) << flag.output;
  EXPECT_NE(flag.output.find("export: inference.fold_bn = false (--set 'inference.fold_bn=false'), "
                             "but an export always folds BatchNorm into the convolutions"),
            std::string::npos)
      << flag.output;
  EXPECT_EQ(flag.output.find(".cpp:"), std::string::npos) << flag.output;
  EXPECT_NE(run_shell("test -e " + out).exit_code, 0) << "nothing is written";

  const Config unfolded = parse_config("model: {arch: resnet}\ninference: {fold_bn: false}\n", "t");
  ParamStore params;
  register_resnet_params(resnet_shape(unfolded.model), params);
  params.allocate();
  params.initialize(5);
  const std::string checkpoint = temp_path("unfolded.ckpt.safetensors");
  fold_test::write_checkpoint(checkpoint, unfolded, params);
  const test::RunResult embedded =
      run_fusiontrain("export --checkpoint " + checkpoint + " --out " + out, 60);
  EXPECT_EQ(embedded.exit_code, 1) << embedded.output;
  EXPECT_NE(embedded.output.find("(the config embedded in " + checkpoint), std::string::npos)
      << embedded.output;
  const test::RunResult forced = run_fusiontrain(
      "export --checkpoint " + checkpoint + " --out " + out + " --set inference.fold_bn=true", 60);
  EXPECT_EQ(forced.exit_code, 0) << forced.output;
  EXPECT_NE(forced.output.find("convolutions with BatchNorm folded in"), std::string::npos)
      << forced.output;
}

TEST(Export, GptExportHoldsTheParametersAndSamplesLikeItsCheckpoint) {
  const Config config =
      parse_config("model: {arch: gpt, n_layer: 1, n_head: 2, d_model: 16, seq_len: 8}\n", "test");
  ParamStore params;
  register_gpt_params(gpt_shape(config.model), params);
  params.allocate();
  params.initialize(4);
  const std::string checkpoint = temp_path("gpt.ckpt.safetensors");
  fold_test::write_checkpoint(checkpoint, config, params);
  const std::string out = temp_path("gpt.export.safetensors");
  const test::RunResult exported =
      run_fusiontrain("export --checkpoint " + checkpoint + " --out " + out, 60);
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const nlohmann::json header = read_header(out);
  EXPECT_EQ(header.at("__metadata__").at("arch"), "gpt");
  EXPECT_EQ(static_cast<int>(header.size()) - 1, params.size());
  EXPECT_TRUE(header.contains("wte.weight"));
  const SafetensorsFile file = load_safetensors(out);
  const Param& wte = params[params.find("wte.weight")];
  EXPECT_EQ(file.tensors.at("wte.weight").data,
            std::vector<float>(wte.value.data(), wte.value.data() + wte.value.numel()));
  const test::RunResult infer = run_fusiontrain("infer --model " + out, 60);
  EXPECT_EQ(infer.exit_code, 1);
  EXPECT_NE(infer.output.find("sample"), std::string::npos) << infer.output;
  // eval reads training checkpoints: it says the file is an export and names its source.
  expect_refused("eval --checkpoint " + out,
                 {out + " is an export (metadata 'format' 'fusiontrain-export-1')",
                  "(metadata source_checkpoint: " + checkpoint + ")"});
  // sample takes the export as --model, and writes what it writes from the checkpoint.
  expect_refused("sample --checkpoint " + out, {"pass it as --model " + out});
  const std::string flags = " --prompt 'Call me' --max-new-tokens 24 --seed 5 --json ";
  const test::RunResult from_checkpoint = run_fusiontrain(
      "sample --checkpoint " + checkpoint + flags + temp_path("ckpt.sample.json"), 60);
  const test::RunResult from_export =
      run_fusiontrain("sample --model " + out + flags + temp_path("export.sample.json"), 60);
  ASSERT_EQ(from_checkpoint.exit_code, 0) << from_checkpoint.output;
  ASSERT_EQ(from_export.exit_code, 0) << from_export.output;
  const nlohmann::json checkpoint_row = read_json(temp_path("ckpt.sample.json"));
  const nlohmann::json export_row = read_json(temp_path("export.sample.json"));
  EXPECT_EQ(export_row.at("new_tokens"), checkpoint_row.at("new_tokens"));
  EXPECT_EQ(export_row.at("new_tokens").size(), 24u);
  EXPECT_EQ(export_row.at("model"), out);
  // A checkpoint is no export, and a ResNet export samples no text.
  expect_refused("sample --model " + checkpoint, {"a training checkpoint goes to --checkpoint"});
  expect_refused("sample --model " + resnet_export(),
                 {"is a resnet export; sample generates text from GPT exports"});
}

// --compare-unfolded with a checkpoint the export was not made from compares two models: refused,
// naming both files and the export's source.
TEST(Export, InferRefusesToCompareWithAnotherCheckpoint) {
  const std::string other = write_resnet_checkpoint("other.ckpt.safetensors", 31);
  const test::RunResult result = run_fusiontrain(
      "infer --model " + resnet_export() + " --compare-unfolded " + other + " --limit 8", 120);
  EXPECT_EQ(result.exit_code, 2) << result.output;  // a usage error
  EXPECT_NE(result.output.find("--compare-unfolded " + other), std::string::npos) << result.output;
  EXPECT_NE(result.output.find(resnet_export() + " was exported from " + resnet_checkpoint()),
            std::string::npos)
      << result.output;
  EXPECT_EQ(result.output.find("predictions agree"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace ft

// `export --dtype bf16` and reading bf16 exports (app/inference/inference_model.h): half the data
// bytes, every tensor the fp32 value (a GPT's master, a ResNet's folded weight) rounded to nearest,
// ties to even, the dtype in the metadata; infer, sample and scripts/load_export.py reading them as
// those values widened exactly; and an export whose metadata contradicts its tensors refused.
// `--precision bf16` runs are in tests/inference_bf16_test.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/inference/inference_model.h"
#include "app/training/task.h"
#include "core/atomic_file.h"
#include "core/math/bf16_math.h"
#include "model/gpt.h"
#include "tests/export_test_util.h"
#include "tests/fold_test_util.h"
#include "tests/run_command.h"

namespace ft {
namespace {

using test::run_fusiontrain;
using test::run_shell;
using namespace export_test;

nlohmann::json read_header(const std::string& path) {
  const std::string bytes = read_file(path);
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  return nlohmann::json::parse(bytes.substr(8, length));
}

uint64_t data_bytes(const std::string& path) {
  const std::string bytes = read_file(path);
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  return bytes.size() - 8 - length;
}

std::vector<uint32_t> bits_of(const std::vector<float>& values) {
  std::vector<uint32_t> bits;
  for (float value : values) bits.push_back(float_bits(value));
  return bits;
}

std::vector<float> rounded(const std::vector<float>& values) {
  std::vector<float> out;
  for (float value : values) out.push_back(round_to_bf16(value));
  return out;
}

// `fusiontrain export` of `checkpoint` with `flags`, checked to succeed.
std::string export_of(const std::string& checkpoint, const std::string& name,
                      const std::string& flags) {
  const std::string out = temp_path(name);
  const test::RunResult result =
      run_fusiontrain("export --checkpoint " + checkpoint + " --out " + out + " " + flags, 120);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return out;
}

// A small GPT checkpoint (d_model 32, so the tensors outweigh the metadata) and its masters.
struct GptCheckpoint {
  GptCheckpoint() {
    config = parse_config("model: {arch: gpt, n_layer: 1, n_head: 2, d_model: 32, seq_len: 8}\n",
                          "test");
    register_gpt_params(gpt_shape(config.model), params);
    params.allocate();
    params.initialize(4);
    path = temp_path("gpt_bf16.ckpt.safetensors");
    fold_test::write_checkpoint(path, config, params);
  }
  std::vector<float> master(const std::string& name) const {
    const Tensor& value = params[params.find(name)].value;
    return std::vector<float>(value.data(), value.data() + value.numel());
  }
  Config config;
  ParamStore params;
  std::string path;
};

const GptCheckpoint& gpt() {
  static const GptCheckpoint checkpoint;
  return checkpoint;
}

TEST(ExportBf16, GptHalvesTheDataAndRoundsEveryMaster) {
  const std::string fp32 = export_of(gpt().path, "gpt.fp32.safetensors", "--dtype fp32");
  const std::string plain = export_of(gpt().path, "gpt.default.safetensors", "");
  const std::string bf16 = export_of(gpt().path, "gpt.bf16.safetensors", "--dtype bf16");
  EXPECT_EQ(read_file(plain), read_file(fp32)) << "fp32 is the default";

  EXPECT_EQ(2 * data_bytes(bf16), data_bytes(fp32));
  const double ratio = static_cast<double>(std::filesystem::file_size(bf16)) /
                       static_cast<double>(std::filesystem::file_size(fp32));
  EXPECT_LT(ratio, 0.6) << "the metadata is the rest";
  std::printf("  bf16 export %ju bytes, fp32 %ju (%.2f)\n",
              static_cast<uintmax_t>(std::filesystem::file_size(bf16)),
              static_cast<uintmax_t>(std::filesystem::file_size(fp32)), ratio);

  const nlohmann::json header = read_header(bf16);
  EXPECT_EQ(header.at("__metadata__").at("dtype"), "bf16");
  EXPECT_EQ(read_header(fp32).at("__metadata__").at("dtype"), "fp32");
  EXPECT_EQ(static_cast<int>(header.size()) - 1, gpt().params.size());
  for (const auto& [name, entry] : header.items())
    EXPECT_TRUE(name == "__metadata__" || entry.at("dtype") == "BF16") << name;

  const SafetensorsFile file = load_safetensors(bf16);
  for (ParamId id = 0; id < gpt().params.size(); ++id) {
    const std::string& name = gpt().params[id].name;
    EXPECT_EQ(file.tensors.at(name).dtype, DType::kBF16) << name;
    EXPECT_EQ(bits_of(file.tensors.at(name).data), bits_of(rounded(gpt().master(name)))) << name;
  }
  EXPECT_EQ(export_dtype(file, bf16), DType::kBF16);
}

// sample --model of a bf16 export writes what sample --checkpoint writes from a checkpoint of the
// masters rounded to bf16: the widening on read is exact.
TEST(ExportBf16, SampleReadsABf16ExportAsItsRoundedMasters) {
  const std::string bf16 = export_of(gpt().path, "gpt.bf16.sample.safetensors", "--dtype bf16");
  ParamStore rounded_params;
  register_gpt_params(gpt_shape(gpt().config.model), rounded_params);
  rounded_params.allocate();
  for (ParamId id = 0; id < rounded_params.size(); ++id) {
    const std::vector<float> values = rounded(gpt().master(rounded_params[id].name));
    std::copy(values.begin(), values.end(), rounded_params[id].value.data());
  }
  const std::string checkpoint = temp_path("gpt_rounded.ckpt.safetensors");
  fold_test::write_checkpoint(checkpoint, gpt().config, rounded_params);

  const std::string flags = " --prompt 'Call me' --max-new-tokens 24 --seed 5 --json ";
  auto sample = [&](const std::string& source, const std::string& name) {
    const std::string json = temp_path(name);
    const test::RunResult result = run_fusiontrain("sample " + source + flags + json, 60);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return nlohmann::json::parse(read_file(json));
  };
  const nlohmann::json from_export = sample("--model " + bf16, "bf16_export.json");
  const nlohmann::json from_checkpoint = sample("--checkpoint " + checkpoint, "rounded.json");
  EXPECT_EQ(from_export.at("new_tokens"), from_checkpoint.at("new_tokens"));
  EXPECT_EQ(from_export.at("new_tokens").size(), 24u);
  EXPECT_EQ(from_export.at("settings").at("weights_dtype"), "bf16");
  EXPECT_EQ(from_export.at("settings").at("precision"), "fp32");
  EXPECT_EQ(from_checkpoint.at("settings").at("weights_dtype"), "fp32");
}

TEST(ExportBf16, ResnetRoundsTheFoldedWeightsAndInfers) {
  const std::string bf16 =
      export_of(resnet_checkpoint(), "resnet.bf16.safetensors", "--dtype bf16");
  EXPECT_EQ(2 * data_bytes(bf16), data_bytes(resnet_export()));
  const SafetensorsFile folded = load_safetensors(resnet_export());
  const SafetensorsFile file = load_safetensors(bf16);
  ASSERT_EQ(file.tensors.size(), folded.tensors.size());
  for (const auto& [name, entry] : folded.tensors) {
    EXPECT_EQ(file.tensors.at(name).dtype, DType::kBF16) << name;
    EXPECT_EQ(bits_of(file.tensors.at(name).data), bits_of(rounded(entry.data))) << name;
  }
  EXPECT_EQ(file.metadata.at("plan"), folded.metadata.at("plan"));

  const std::string json = temp_path("infer_bf16_export.json");
  const test::RunResult infer = run_fusiontrain(
      "infer --model " + bf16 + " --limit 64 --batch 32 --threads 1 --json " + json, 120);
  ASSERT_EQ(infer.exit_code, 0) << infer.output;
  EXPECT_NE(infer.output.find("batch 32, 1 thread, bf16 weights widened to fp32"),
            std::string::npos)
      << infer.output;
  const nlohmann::json row = nlohmann::json::parse(read_file(json));
  EXPECT_EQ(row.at("weights_dtype"), "bf16");
  EXPECT_EQ(row.at("precision"), "fp32");

  // Its logits against the fp32 export's: bf16 weights (8 significant bits) move them by a few
  // 2^-9 relative roundings at most, far from 5e-2 of the largest logit; but they do move.
  const int count = 64;
  auto logits_of = [&](const std::string& path) {
    ExportedResnet model(path);
    return test_image_logits(model, count).to_host_vector();
  };
  const double moved = max_relative_logit_diff(logits_of(bf16), logits_of(resnet_export()));
  std::printf("  bf16 export vs fp32 export: max relative logit difference %.2e\n", moved);
  EXPECT_LT(moved, 5e-2);
  EXPECT_GT(moved, 1e-5);
}

// PyTorch reads the BF16 tensors from the file alone and reproduces infer's logits for them.
TEST(ExportBf16, PytorchReadsABf16Export) {
  if (run_shell(std::string(kPython) + " -c 'import torch, numpy'").exit_code != 0)
    GTEST_SKIP() << "python3-torch is not installed (scripts/bootstrap.sh installs it)";
  const std::string bf16 =
      export_of(resnet_checkpoint(), "resnet.bf16.py.safetensors", "--dtype bf16");
  const int count = 64;
  ExportedResnet model(bf16);
  const Tensor& logits = test_image_logits(model, count);
  const std::string expect = temp_path("bf16_logits.f32");
  std::ofstream(expect, std::ios::binary)
      .write(reinterpret_cast<const char*>(logits.data()), logits.bytes());
  const test::RunResult result =
      run_shell(std::string("cd ") + FT_SOURCE_DIR + " && " + kPython +
                " scripts/load_export.py --export " + bf16 + " --count 64 --expect " + expect);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("predictions agree 64/64"), std::string::npos) << result.output;
}

// The metadata's dtype is checked against the tensors, by infer and by sample alike.
TEST(ExportBf16, ExportsThatContradictTheirDtypeAreRefused) {
  const std::string resnet =
      export_of(resnet_checkpoint(), "resnet.bf16.bad.safetensors", "--dtype bf16");
  const std::string gpt_export = export_of(gpt().path, "gpt.bf16.bad.safetensors", "--dtype bf16");
  for (const auto& [path, job] : {std::pair<std::string, std::string>{resnet, "infer --model "},
                                  {gpt_export, "sample --max-new-tokens 2 --model "}}) {
    SafetensorsFile file = load_safetensors(path);
    file.metadata["dtype"] = "fp32";
    const std::string wrong = path + ".wrong";
    save_safetensors(wrong, file);
    expect_refused(job + wrong, {wrong + ": tensor '",
                                 "' is stored as bf16, but the export's "
                                 "metadata says dtype fp32; the export contradicts itself"});
    file.metadata["dtype"] = "fp8";
    const std::string unknown = path + ".unknown";
    save_safetensors(unknown, file);
    expect_refused(job + unknown, {unknown + ": export metadata dtype is 'fp8', not fp32 or bf16"});
  }
}

// A bad --dtype is a usage error naming the flag and both values, and writes nothing.
TEST(ExportBf16, BadDtypeIsRefusedNamingTheAllowedValues) {
  const std::string out = temp_path("never.bf16.safetensors");
  for (const char* value : {"fp16", "BF16", "''"}) {
    const test::RunResult result = run_fusiontrain(
        "export --checkpoint " + gpt().path + " --out " + out + " --dtype " + std::string(value),
        60);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find("--dtype"), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find(".cpp:"), std::string::npos) << result.output;
    EXPECT_FALSE(std::filesystem::exists(out));
  }
  const test::RunResult fp16 =
      run_fusiontrain("export --checkpoint " + gpt().path + " --out " + out + " --dtype fp16", 60);
  EXPECT_NE(fp16.output.find("error: --dtype: expected one of fp32, bf16, got 'fp16' (run "
                             "'fusiontrain export --help')"),
            std::string::npos)
      << fp16.output;
}

}  // namespace
}  // namespace ft

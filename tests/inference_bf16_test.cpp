// `--precision bf16` of `sample` and `infer` through the binary: the run says which precision and
// bf16 path it took, stays close to its fp32 run (greedy bytes of a GPT with peaked predictions;
// a ResNet's predictions and, against its unfolded twin in the same precision, its logits), and
// bad values or an unbuilt combination are refused naming the flag. The decoder's logits against
// the bf16 graph and against fp32 are checked in tests/gpt_decode_bf16_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/inference/inference_model.h"
#include "app/training/task.h"
#include "core/atomic_file.h"
#include "core/device.h"
#include "core/gemm.h"
#include "core/rng.h"
#include "model/gpt.h"
#include "tests/export_test_util.h"
#include "tests/fold_test_util.h"
#include "tests/gpt_decode_test_util.h"
#include "tests/run_command.h"

namespace ft {
namespace {

using test::run_fusiontrain;
using namespace export_test;

// A GPT checkpoint whose weights are drawn large (tests/gpt_decode_test_util.h): its next-byte
// predictions are peaked, so bf16 rounding moves no greedy choice (the decoder test bounds that
// movement), where a freshly initialised or briefly trained model is all near-ties.
const std::string& peaked_gpt_checkpoint() {
  static const std::string path = [] {
    const Config config = parse_config(
        "model: {arch: gpt, n_layer: 2, n_head: 2, d_model: 32, seq_len: 16}\n", "test");
    ParamStore params;
    register_gpt_params(gpt_shape(config.model), params);
    params.allocate();
    decode_test::draw_peaked(params);
    const std::string file = temp_path("peaked_gpt.ckpt.safetensors");
    fold_test::write_checkpoint(file, config, params);
    return file;
  }();
  return path;
}

nlohmann::json run_json(const std::string& args, const std::string& name, std::string* output) {
  const std::string json = temp_path(name);
  const test::RunResult result = run_fusiontrain(args + " --json " + json, 300);
  EXPECT_EQ(result.exit_code, 0) << args << "\n" << result.output;
  if (output != nullptr) *output = result.output;
  return nlohmann::json::parse(read_file(json));
}

TEST(InferenceBf16, SamplePrecisionBf16WritesTheGreedyBytesOfFp32) {
  const std::string common = "sample --checkpoint " + peaked_gpt_checkpoint() +
                             " --prompt 'Call me Ishmael' --max-new-tokens 12 --temperature 0";
  std::string output;
  const nlohmann::json fp32 = run_json(common, "sample_fp32.json", nullptr);
  const nlohmann::json bf16 = run_json(common + " --precision bf16", "sample_bf16.json", &output);
  EXPECT_EQ(fp32.at("settings").at("precision"), "fp32");
  EXPECT_EQ(bf16.at("settings").at("precision"), "bf16");
  EXPECT_NE(output.find("| precision bf16, "), std::string::npos) << output;
  EXPECT_EQ(bf16.at("new_tokens"), fp32.at("new_tokens"));
  // The KV cache and the recompute path agree in bf16 too.
  const test::RunResult compare =
      run_fusiontrain(common + " --precision bf16 --compare-no-cache", 300);
  EXPECT_EQ(compare.exit_code, 0) << compare.output;
  EXPECT_NE(compare.output.find("same text"), std::string::npos) << compare.output;
}

// The export against its unfolded twin, both in bf16: folding moves the bf16 rounding (the
// folded weight is rounded, not the raw one), so the logits differ by bf16 roundings, not 1e-4
// as in fp32; and the predictions stay those of fp32.
TEST(InferenceBf16, InferPrecisionBf16StaysCloseToItsTwinAndToFp32) {
  const std::string common = "infer --model " + resnet_export() +
                             " --limit 64 --batch 32 "
                             "--threads 1 --compare-unfolded " +
                             resnet_checkpoint();
  std::string output;
  const nlohmann::json fp32 = run_json(common, "infer_fp32.json", nullptr);
  const nlohmann::json bf16 = run_json(common + " --precision bf16", "infer_bf16.json", &output);
  EXPECT_NE(output.find("precision bf16: GEMM and convolution operands in bf16"), std::string::npos)
      << output;
  EXPECT_EQ(bf16.at("precision"), "bf16");
  EXPECT_EQ(fp32.at("precision"), "fp32");
  const double twin = bf16.at("compare").at("max_rel_logit_diff").get<double>();
  std::printf(
      "  bf16 export vs bf16 unfolded: max relative logit difference %.2e; accuracy %.4f "
      "(fp32 %.4f)\n",
      twin, bf16.at("accuracy").get<double>(), fp32.at("accuracy").get<double>());
  EXPECT_LT(twin, 5e-2);
  EXPECT_GT(twin, fp32.at("compare").at("max_rel_logit_diff").get<double>())
      << "bf16 rounds nothing";
  EXPECT_GE(bf16.at("compare").at("prediction_agreement").get<double>(), 62.0 / 64);
  EXPECT_NEAR(bf16.at("accuracy").get<double>(), fp32.at("accuracy").get<double>(), 2.0 / 64);
}

// In process, the export's own logits: bf16 operands move them by bf16 roundings (well under 5e-2
// of the largest logit), and do move them, so the bf16 graph is the one that ran.
TEST(InferenceBf16, ExportedResnetInBf16MovesTheLogitsByBf16Rounding) {
  const int count = 64;
  auto logits_of = [&](DType precision) {
    ExportedResnet model(resnet_export(), Device::kCpu, precision);
    EXPECT_EQ(model.precision(), precision);
    return test_image_logits(model, count).to_host_vector();
  };
  const double moved = max_relative_logit_diff(logits_of(DType::kBF16), logits_of(DType::kF32));
  std::printf("  export in bf16 vs fp32: max relative logit difference %.2e (%s)\n", moved,
              bf16_gemm_path());
  EXPECT_LT(moved, 5e-2);
  EXPECT_GT(moved, 1e-4) << "bf16 operands that round nothing";
}

void expect_usage_error(const std::string& args, const std::string& needle) {
  const test::RunResult result = run_fusiontrain(args, 60);
  EXPECT_EQ(result.exit_code, 2) << args << "\n" << result.output;
  EXPECT_NE(result.output.find(needle), std::string::npos)
      << args << ": expected '" << needle << "' in: " << result.output;
  EXPECT_EQ(result.output.find(".cpp:"), std::string::npos) << result.output;
}

TEST(InferenceBf16, BadPrecisionIsRefusedNamingTheAllowedValues) {
  expect_usage_error("infer --model " + resnet_export() + " --precision fp16",
                     "error: --precision: expected one of fp32, bf16, got 'fp16' (run "
                     "'fusiontrain infer --help')");
  expect_usage_error("sample --checkpoint " + peaked_gpt_checkpoint() + " --precision half",
                     "error: --precision: expected one of fp32, bf16, got 'half' (run "
                     "'fusiontrain sample --help')");
  const test::RunResult help = run_fusiontrain("sample --help", 30);
  EXPECT_NE(help.output.find("--precision TEXT:{fp32,bf16}=fp32"), std::string::npos)
      << help.output;
}

}  // namespace
}  // namespace ft

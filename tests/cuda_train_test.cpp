// Both models train on cuda with the losses of the cpu run, fused and unfused; a cuda-trained
// checkpoint loads on the cpu (checkpoints do not depend on the device), exports, and its export
// infers on the GPU in fp32 and bf16. Skips without a usable device. Tolerances: the GPU sums in
// other orders (cuBLASLt, cuDNN, tree reductions), so fp32 losses drift apart by ~1e-5 relative per
// step; 20 steps stay within 2e-3.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/training/trainer.h"
#include "core/atomic_file.h"
#include "cuda_test_util.h"
#include "run_command.h"

namespace ft {
namespace {

std::string source_path(const std::string& relative) {
  return std::string(FT_SOURCE_DIR) + "/" + relative;
}

Config config_for(const std::string& name, const std::string& device, bool fused) {
  std::vector<std::string> overrides = {"train.device=" + device, "train.steps=20",
                                        "fusion.enabled=" + std::string(fused ? "true" : "false")};
  if (name == "gpt_tiny") overrides.push_back("data.path=" + source_path("data/moby_dick.txt"));
  if (name == "resnet8") overrides.push_back("data.test_limit=512");
  return load_config(source_path("configs/" + name + ".yaml"), overrides);
}

std::vector<float> losses_of(Trainer& trainer, int steps) {
  std::vector<float> losses;
  for (int i = 0; i < steps; ++i) losses.push_back(trainer.train_step().loss);
  return losses;
}

void expect_losses_match(const std::vector<float>& cuda, const std::vector<float>& cpu) {
  ASSERT_EQ(cuda.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(cuda[i], cpu[i], 2e-3 * std::fabs(cpu[i])) << "step " << i + 1;
}

class CudaTrain : public testing::TestWithParam<const char*> {};

TEST_P(CudaTrain, TwentyStepsMatchTheCpuFusedAndUnfused) {
  FT_SKIP_WITHOUT_GPU();
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    Trainer on_cpu(config_for(GetParam(), "cpu", fused), nullptr);
    Trainer on_cuda(config_for(GetParam(), test::kGpuName, fused), nullptr);
    expect_losses_match(losses_of(on_cuda, 20), losses_of(on_cpu, 20));
    const double cpu_eval = on_cpu.evaluate(4).loss, cuda_eval = on_cuda.evaluate(4).loss;
    EXPECT_NEAR(cuda_eval, cpu_eval, 2e-3 * std::fabs(cpu_eval));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaTrain, testing::Values("gpt_tiny", "resnet8"));

TEST(CudaTrainCheckpoint, ACudaCheckpointResumesOnTheCpu) {
  FT_SKIP_WITHOUT_GPU();
  const std::string path = testing::TempDir() + "/ft_cuda_ckpt.safetensors";
  Trainer on_cuda(config_for("gpt_tiny", test::kGpuName, true), nullptr);
  losses_of(on_cuda, 3);
  on_cuda.save_checkpoint(path);
  const std::vector<float> cuda_next = losses_of(on_cuda, 2);
  Config resumed = config_for("gpt_tiny", "cpu", true);
  resumed.train.resume = path;
  Trainer on_cpu(resumed, nullptr);
  expect_losses_match(cuda_next, losses_of(on_cpu, 2));
  std::filesystem::remove(path);
}

TEST(CudaTrainCheckpoint, ACudaTrainedResnetExportsAndInfers) {
  FT_SKIP_WITHOUT_GPU();
  const std::string checkpoint = testing::TempDir() + "/ft_cuda_resnet.safetensors";
  const std::string exported = testing::TempDir() + "/ft_cuda_resnet_export.safetensors";
  Trainer on_cuda(config_for("resnet8", test::kGpuName, true), nullptr);
  losses_of(on_cuda, 3);
  on_cuda.save_checkpoint(checkpoint);
  const test::RunResult export_run =
      test::run_fusiontrain("export --checkpoint " + checkpoint + " --out " + exported, 120);
  ASSERT_EQ(export_run.exit_code, 0) << export_run.output;
  const test::RunResult infer_run = test::run_fusiontrain(
      "infer --model " + exported + " --limit 256 --compare-unfolded " + checkpoint, 120);
  ASSERT_EQ(infer_run.exit_code, 0) << infer_run.output;
  EXPECT_NE(infer_run.output.find("predictions agree 256/256"), std::string::npos)
      << infer_run.output;
  // The same export and checkpoint run on the GPU: the same predictions as the unfolded model.
  const test::RunResult cuda_infer =
      test::run_fusiontrain(std::string("infer --device ") + test::kGpuName + " --model " +
                                exported + " --limit 256 --compare-unfolded " + checkpoint,
                            120);
  ASSERT_EQ(cuda_infer.exit_code, 0) << cuda_infer.output;
  EXPECT_NE(cuda_infer.output.find("predictions agree 256/256"), std::string::npos)
      << cuda_infer.output;
  // In bf16 on the GPU: the folded and the unfolded model both round their operands (and cuDNN
  // its convolution outputs), so they differ by bf16 rounding of the folded weights, as on the
  // CPU (tests/inference_bf16_test.cpp's bounds), and predict like the CPU's bf16 run.
  const std::string json = testing::TempDir() + "/ft_cuda_resnet_bf16.json";
  const std::string bf16_command = " --model " + exported + " --limit 256 --precision bf16" +
                                   " --compare-unfolded " + checkpoint + " --json " + json;
  const test::RunResult cuda_bf16 =
      test::run_fusiontrain(std::string("infer --device ") + test::kGpuName + bf16_command, 120);
  ASSERT_EQ(cuda_bf16.exit_code, 0) << cuda_bf16.output;
  const std::string bf16_kernels = test::kGpu == Device::kCuda
                                       ? "cuDNN and cuBLASLt bf16 kernels on the GPU"
                                       : "precision bf16: GEMM and convolution operands in bf16";
  EXPECT_NE(cuda_bf16.output.find(bf16_kernels), std::string::npos) << cuda_bf16.output;
  const nlohmann::json on_gpu = nlohmann::json::parse(read_file(json));
  EXPECT_EQ(on_gpu.at("precision"), "bf16");
  EXPECT_LT(on_gpu.at("compare").at("max_rel_logit_diff").get<double>(), 5e-2);
  EXPECT_GE(on_gpu.at("compare").at("prediction_agreement").get<double>(), 250.0 / 256);
  const test::RunResult cpu_bf16 = test::run_fusiontrain("infer --device cpu" + bf16_command, 120);
  ASSERT_EQ(cpu_bf16.exit_code, 0) << cpu_bf16.output;
  const nlohmann::json on_cpu = nlohmann::json::parse(read_file(json));
  EXPECT_NEAR(on_gpu.at("accuracy").get<double>(), on_cpu.at("accuracy").get<double>(), 6.0 / 256);
  std::filesystem::remove(json);
  std::filesystem::remove(checkpoint);
  std::filesystem::remove(exported);
}

}  // namespace
}  // namespace ft

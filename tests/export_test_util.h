// Shared by the export tests: a small ResNet config, checkpoints written directly with random
// weights and BatchNorm statistics (tests/fold_test_util.h), their export, an export's logits
// over the test images, and a check that a command is refused with given words. Files live in the
// test's temp folder, per process.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/inference/inference_model.h"
#include "app/training/task.h"
#include "tests/fold_test_util.h"
#include "tests/run_command.h"

namespace ft {
namespace export_test {

// Debian's python3, where python3-torch lives, ahead of any other python3 on PATH.
constexpr const char* kPython =
    "$( [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || echo python3 )";

inline std::string temp_path(const std::string& name) {
  // ctest runs each test as its own process, in parallel: files are per process.
  return ::testing::TempDir() + "/export_test_" + std::to_string(getpid()) + "_" + name;
}

inline Config resnet_config() {
  return parse_config("model: {arch: resnet, resnet_blocks: 1, resnet_width: 16}\n", "test");
}

// A ResNet checkpoint at temp_path(name) with random weights (from `seed`) and BatchNorm
// statistics far from identity.
inline std::string write_resnet_checkpoint(const std::string& name, uint64_t seed) {
  const Config config = resnet_config();
  ParamStore params;
  register_resnet_params(resnet_shape(config.model), params);
  params.allocate();
  params.initialize(seed);
  fold_test::randomize_batchnorms(params, seed + 1);
  const std::string file = temp_path(name);
  fold_test::write_checkpoint(file, config, params);
  return file;
}

inline const std::string& resnet_checkpoint() {
  static const std::string path = write_resnet_checkpoint("resnet.ckpt.safetensors", 21);
  return path;
}

inline const std::string& resnet_export() {
  static const std::string path = [] {
    const std::string file = temp_path("resnet.export.safetensors");
    std::string summary;
    export_model(resnet_checkpoint(), resnet_config(), file, &summary);
    return file;
  }();
  return path;
}

// The logits [count, classes] of `model` over the first `count` test images
// (fold_test::test_images); they live in the model's run for `count` until its next forward.
inline const Tensor& test_image_logits(ExportedResnet& model, int count) {
  const ImageBatch& images = fold_test::test_images(count);
  ExportedResnet::Run& run = model.run(count);
  std::memcpy(run.ws.values[run.graph.input].data(), images.images.data(),
              images.images.size() * sizeof(float));
  run.ws.targets = images.labels;
  run.executor->forward(run.ws);
  return run.ws.values[run.graph.output];
}

// The largest |actual - expected| over the largest |expected|: how far `actual`'s logits moved.
inline double max_relative_logit_diff(const std::vector<float>& actual,
                                      const std::vector<float>& expected) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(actual[i] - expected[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(expected[i])));
  }
  return diff / scale;
}

// `fusiontrain args` exits 1 with an error containing every one of `needles`.
inline void expect_refused(const std::string& args, const std::vector<std::string>& needles) {
  const test::RunResult result = test::run_fusiontrain(args, 60);
  EXPECT_EQ(result.exit_code, 1) << args << "\n" << result.output;
  for (const std::string& needle : needles)
    EXPECT_NE(result.output.find(needle), std::string::npos)
        << args << ": expected '" << needle << "' in: " << result.output;
}

}  // namespace export_test
}  // namespace ft

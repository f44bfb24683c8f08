// comm.grad_dtype: its default, both values, a bad value's message (file, line, key, allowed
// values), and the trainer's translation into GradSyncOptions; and where train.precision: bf16
// may run.
#include <gtest/gtest.h>

#include <string>

#include "app/config/config.h"
#include "comm/comm_dtype.h"
#include "config_test_util.h"

namespace ft {
namespace {

using config_test::parse_error;

TEST(ConfigGradDtype, DefaultsToFp32AndTakesBf16) {
  EXPECT_EQ(parse_config("model: {}\n", "test.yaml").comm.grad_dtype, "fp32");
  EXPECT_EQ(parse_config("comm:\n  grad_dtype: bf16\n", "test.yaml").comm.grad_dtype, "bf16");
  EXPECT_EQ(parse_config("model: {}\n", "test.yaml", {"comm.grad_dtype=bf16"}).comm.grad_dtype,
            "bf16");
  EXPECT_EQ(comm_dtype_from_name("bf16"), CommDtype::kBf16);
  EXPECT_EQ(comm_dtype_bytes(comm_dtype_from_name("fp32")), 4);
}

TEST(ConfigGradDtype, BadValueNamesFileLineKeyAndAllowedValues) {
  const std::string message = parse_error("comm:\n  grad_dtype: fp16\n");
  EXPECT_NE(message.find("test.yaml:2:15"), std::string::npos) << message;
  EXPECT_NE(message.find("comm.grad_dtype"), std::string::npos) << message;
  EXPECT_NE(message.find("one of: fp32, bf16"), std::string::npos) << message;
  const std::string override_message = parse_error("model: {}\n", {"comm.grad_dtype=half"});
  EXPECT_NE(override_message.find("comm.grad_dtype"), std::string::npos) << override_message;
  EXPECT_NE(override_message.find("one of: fp32, bf16"), std::string::npos) << override_message;
}

TEST(ConfigGradDtype, RoundTripsThroughYaml) {
  const Config config = parse_config("comm:\n  grad_dtype: bf16\n", "test.yaml");
  EXPECT_EQ(parse_config(config_to_yaml(config), "again.yaml").comm.grad_dtype, "bf16");
}

// Both models on both devices: the ResNet's bf16 convolutions have a cuDNN path
// (model/ops/conv2d_bf16.cu), so nothing refuses train.precision bf16 by device or model.
TEST(ConfigPrecision, Bf16RunsBothModelsOnEitherDevice) {
  for (const char* arch : {"gpt", "resnet"})
    for (const char* device : {"cpu", "cuda"}) {
      SCOPED_TRACE(std::string(arch) + " on " + device);
      const std::string yaml = std::string("model:\n  arch: ") + arch +
                               "\ntrain:\n  device: " + device + "\n  precision: bf16\n";
      const Config config = parse_config(yaml, "test.yaml");
      EXPECT_EQ(config.train.precision, "bf16");
      EXPECT_EQ(config.train.device, device);
    }
}

}  // namespace
}  // namespace ft

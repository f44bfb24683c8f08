// describe_cuda_versions: each library's integer encoding read back as the version users know,
// and a version that could not be read said so instead of printing "0.0".
#include <gtest/gtest.h>

#include "core/cuda_versions.h"

namespace ft {
namespace {

TEST(CudaVersionsText, DecodesEachLibrarysEncoding) {
  CudaVersions versions;
  versions.runtime = 13000;
  versions.driver = 12080;
  versions.cublaslt = 130102;
  versions.cudnn = 91300;
  versions.nccl = 22803;
  EXPECT_EQ(describe_cuda_versions(versions),
            "CUDA runtime 13.0\nCUDA driver 12.8\ncuBLASLt 13.1.2\ncuDNN 9.13.0\nNCCL 2.28.3\n");
}

TEST(CudaVersionsText, UnreadVersionsAreNamedNotZero) {
  CudaVersions versions;
  versions.runtime = 13000;
  EXPECT_EQ(describe_cuda_versions(versions),
            "CUDA runtime 13.0\nCUDA driver none (no driver loaded)\ncuBLASLt unknown\n"
            "cuDNN unknown\nNCCL unknown\n");
}

}  // namespace
}  // namespace ft

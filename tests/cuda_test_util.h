// FT_SKIP_WITHOUT_GPU(): the first line of every GPU test. It skips with the reason: the build has
// no CUDA path, or the runtime found no usable device (this workplace's usual case).
//
// The same tests also build as emulated_cuda_*_test (tests/CMakeLists.txt, ctest label
// gpu_emulated) with FT_EMULATE_GPU_ON_CPU: the device under test, test::kGpu, is then the CPU,
// so every comparison becomes CPU against CPU. That checks the tests themselves on every CI run:
// their configs, shapes, expectations and tolerances. It says nothing about the CUDA kernels. A
// case about CUDA itself (a CUDA-only limit, say) starts with FT_GPU_ONLY() instead, which skips
// under emulation.
#pragma once
#include <gtest/gtest.h>

#include "core/tensor.h"

namespace ft::test {

#if defined(FT_EMULATE_GPU_ON_CPU)
inline constexpr Device kGpu = Device::kCpu;
inline constexpr const char* kGpuName = "cpu";  // for train.device, infer --device
inline constexpr bool kGpuEmulated = true;
#else
inline constexpr Device kGpu = Device::kCuda;
inline constexpr const char* kGpuName = "cuda";
inline constexpr bool kGpuEmulated = false;
#endif

}  // namespace ft::test

#if defined(FT_EMULATE_GPU_ON_CPU)
#define FT_SKIP_WITHOUT_GPU() static_cast<void>(0)
#define FT_GPU_ONLY() \
  GTEST_SKIP() << "checks CUDA itself; nothing to emulate with the CPU as the device under test"
#elif defined(FT_HAVE_CUDA)
#include "core/cuda/cuda_check.h"
#define FT_SKIP_WITHOUT_GPU()                                                       \
  do {                                                                              \
    if (!::ft::cuda_device_available())                                             \
      GTEST_SKIP() << "no usable CUDA device: " << ::ft::cuda_unavailable_reason(); \
  } while (0)
#define FT_GPU_ONLY() FT_SKIP_WITHOUT_GPU()
#else
#define FT_SKIP_WITHOUT_GPU() \
  GTEST_SKIP() << "built without CUDA (FT_CUDA=OFF, or nvcc, cuDNN or NCCL not found)"
#define FT_GPU_ONLY() FT_SKIP_WITHOUT_GPU()
#endif

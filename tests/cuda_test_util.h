// FT_SKIP_WITHOUT_GPU(): the first line of every GPU test. It skips with the reason: the build has
// no CUDA path, or the runtime found no usable device (this workplace's usual case).
#pragma once
#include <gtest/gtest.h>

#if defined(FT_HAVE_CUDA)
#include "core/cuda/cuda_check.h"
#define FT_SKIP_WITHOUT_GPU()                                                       \
  do {                                                                              \
    if (!::ft::cuda_device_available())                                             \
      GTEST_SKIP() << "no usable CUDA device: " << ::ft::cuda_unavailable_reason(); \
  } while (0)
#else
#define FT_SKIP_WITHOUT_GPU() \
  GTEST_SKIP() << "built without CUDA (FT_CUDA=OFF, or nvcc, cuDNN or NCCL not found)"
#endif

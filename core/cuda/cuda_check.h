// Check macros for the CUDA libraries (runtime, cuBLASLt, cuDNN, NCCL) and a probe that says
// whether a usable GPU is present. Every CUDA call in fusiontrain goes through one of the macros,
// so a failure throws ft::Error naming the file, line, expression and the library's own message.
// The macros compare against 0, which is the success code of all four libraries, so this header
// needs only the runtime API; the message lookup lives in cuda_check.cpp.
// Thread safety: stateless, safe from any thread.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "core/check.h"
#include "core/launch_counter.h"

namespace ft {

enum class CudaLibrary { kRuntime, kCublas, kCudnn, kNccl };

// Builds "file:line: <library> call `expr` failed with status <code>: <library message>".
std::string cuda_error_message(CudaLibrary library, int status, const char* expr, const char* file,
                               int line);

// True when the runtime finds a driver and at least one device. Never throws.
bool cuda_device_available();
// Why cuda_device_available() is false (the runtime's message); empty when it is true.
std::string cuda_unavailable_reason();

}  // namespace ft

#define FT_CUDA_LIBRARY_CHECK_(library, expr)                                                      \
  do {                                                                                             \
    const int ft_status_ = static_cast<int>(expr);                                                 \
    if (ft_status_ != 0)                                                                           \
      throw ::ft::Error(::ft::cuda_error_message(library, ft_status_, #expr, __FILE__, __LINE__)); \
  } while (0)

#define FT_CUDA_CHECK(expr) FT_CUDA_LIBRARY_CHECK_(::ft::CudaLibrary::kRuntime, expr)
#define FT_CUBLAS_CHECK(expr) FT_CUDA_LIBRARY_CHECK_(::ft::CudaLibrary::kCublas, expr)
#define FT_CUDNN_CHECK(expr) FT_CUDA_LIBRARY_CHECK_(::ft::CudaLibrary::kCudnn, expr)
#define FT_NCCL_CHECK(expr) FT_CUDA_LIBRARY_CHECK_(::ft::CudaLibrary::kNccl, expr)

// Checks the launch of the kernel just issued (bad configuration, no device) and counts it for
// `fusiontrain bench` (core/launch_counter.h); execution errors surface at the next synchronising
// call. Every `<<<...>>>` is followed by its own FT_CUDA_CHECK_LAUNCH() before the next launch,
// so the count is exact (tests/launch_count_convention_test.cpp holds every .cu file to it).
#define FT_CUDA_CHECK_LAUNCH()                     \
  do {                                             \
    FT_CUDA_CHECK(cudaGetLastError());             \
    ::ft::count_launch(::ft::LaunchKind::kKernel); \
  } while (0)

// Error strings for the CUDA check macros, and the device probe.
#include "core/cuda/cuda_check.h"

#include <cublasLt.h>
#include <cudnn.h>
#include <nccl.h>

namespace ft {
namespace {

const char* library_name(CudaLibrary library) {
  switch (library) {
    case CudaLibrary::kRuntime:
      return "CUDA";
    case CudaLibrary::kCublas:
      return "cuBLAS";
    case CudaLibrary::kCudnn:
      return "cuDNN";
    case CudaLibrary::kNccl:
      return "NCCL";
  }
  return "CUDA library";
}

std::string status_text(CudaLibrary library, int status) {
  switch (library) {
    case CudaLibrary::kRuntime: {
      const auto error = static_cast<cudaError_t>(status);
      return detail::concat(cudaGetErrorName(error), ": ", cudaGetErrorString(error));
    }
    case CudaLibrary::kCublas:
      return cublasLtGetStatusString(static_cast<cublasStatus_t>(status));
    case CudaLibrary::kCudnn:
      return cudnnGetErrorString(static_cast<cudnnStatus_t>(status));
    case CudaLibrary::kNccl:
      return ncclGetErrorString(static_cast<ncclResult_t>(status));
  }
  return "unknown status";
}

// The runtime is probed once: the answer cannot change while the process runs, and a second
// cudaGetDeviceCount after a failure would return the same sticky error.
struct DeviceProbe {
  bool available = false;
  std::string reason;
};

const DeviceProbe& device_probe() {
  static const DeviceProbe probe = [] {
    DeviceProbe result;
    int device_count = 0;
    const cudaError_t error = cudaGetDeviceCount(&device_count);
    if (error != cudaSuccess) {
      result.reason = detail::concat("cudaGetDeviceCount failed: ", cudaGetErrorName(error), ": ",
                                     cudaGetErrorString(error));
      cudaGetLastError();  // clear, so the next check macro does not report this probe
    } else if (device_count == 0) {
      result.reason = "the CUDA runtime found no devices";
    } else {
      result.available = true;
    }
    return result;
  }();
  return probe;
}

}  // namespace

std::string cuda_error_message(CudaLibrary library, int status, const char* expr, const char* file,
                               int line) {
  // A caught runtime error must not resurface at the next FT_CUDA_CHECK_LAUNCH; sticky errors
  // (a faulted context) come back from every later call anyway.
  if (library == CudaLibrary::kRuntime) cudaGetLastError();
  return detail::concat(file, ":", line, ": ", library_name(library), " call `", expr,
                        "` failed with status ", status, ": ", status_text(library, status));
}

bool cuda_device_available() {
  try {
    return device_probe().available;
  } catch (...) {
    return false;  // a failed string allocation must not escape a yes/no probe
  }
}

std::string cuda_unavailable_reason() {
  try {
    return device_probe().reason;
  } catch (...) {
    return "the CUDA device probe failed";
  }
}

}  // namespace ft

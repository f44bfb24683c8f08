#include "core/device.h"

#if defined(FT_HAVE_CUDA)
#include "core/cuda/cuda_check.h"
#endif

namespace ft {

const char* device_name(Device device) {
  return device == Device::kCuda ? "cuda" : "cpu";
}

std::string cuda_unusable_reason(const std::string& setting) {
#if defined(FT_HAVE_CUDA)
  if (cuda_device_available()) return "";
  return setting + " needs a CUDA GPU, but none can be used: " + cuda_unavailable_reason();
#else
  return setting +
         " needs the CUDA path, and this binary was built without it (configure with "
         "-DFT_CUDA=ON on a machine with nvcc, cuDNN and NCCL)";
#endif
}

}  // namespace ft

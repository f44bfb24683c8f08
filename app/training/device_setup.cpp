#include "app/training/device_setup.h"

#include <cstdio>
#include <cstdlib>

#include "core/check.h"
#include "core/cuda_versions.h"
#include "core/gemm.h"

#if defined(FT_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_context.h"
#endif

namespace ft {

Device setup_device(const std::string& device, const std::string& setting,
                    const std::string& instead, int local_rank) {
  FT_REQUIRE(device == "cpu" || device == "cuda", setting, " '", device,
             "' is not a device (allowed: cpu, cuda)");
  if (device != "cuda") return Device::kCpu;
  const std::string reason = cuda_unusable_reason(setting + " cuda");
  FT_REQUIRE(reason.empty(), reason, "; use ", instead, " on this machine");
#if defined(FT_HAVE_CUDA)
  select_cuda_device(local_rank);
  cuda_context();  // creates the streams and handles on this rank's GPU now, not mid-step
  // Once per process, from the first rank only: what was loaded is the first thing to read when
  // a GPU image's libraries differ from the build's.
  static bool versions_said = false;
  const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!versions_said && (world_rank == nullptr || std::atoi(world_rank) == 0)) {
    std::fprintf(stderr, "cuda: device %d; loaded:\n%s", cuda_context().device_index(),
                 describe_cuda_versions(loaded_cuda_versions()).c_str());
    versions_said = true;
  }
#else
  static_cast<void>(local_rank);
#endif
  return Device::kCuda;
}

Device setup_device(const Config& config, int local_rank) {
  const Device device =
      setup_device(config.train.device, "train.device:", "train.device: cpu", local_rank);
#if defined(FT_HAVE_CUDA)
  if (device == Device::kCuda) set_gemm_tf32(config.train.tf32);
#endif
  return device;
}

std::string bf16_kernels_text(Device device) {
  return device == Device::kCuda ? "cuDNN and cuBLASLt bf16 kernels on the GPU" : bf16_gemm_path();
}

}  // namespace ft

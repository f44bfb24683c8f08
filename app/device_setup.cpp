#include "app/device_setup.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "core/check.h"
#include "core/cuda_versions.h"
#include "core/gemm.h"

#if defined(FT_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "comm/nccl/nccl_communicator.h"
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

std::string gradient_backend(const Config& config, Communicator& comm) {
  if (config.train.device != "cuda" || config.comm.backend == "mpi") return "mpi";
  // counts[0]: machines (ranks with local rank 0); counts[1]: ranks whose machine has fewer GPUs
  // than ranks. Summed over every rank, so all of them decide alike.
  float counts[2] = {comm.local_rank() == 0 ? 1.0f : 0.0f, 0.0f};
  comm.allreduce(counts, 1, ReduceOp::kSum);
  // No usable device counts as none: setup_device has refused cuda already in a real run.
  int devices = 0;
#if defined(FT_HAVE_CUDA)
  if (cuda_device_available() && cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
#endif
  const int machines = std::max(1, static_cast<int>(counts[0]));
  const int ranks_per_machine = (comm.size() + machines - 1) / machines;
  counts[1] = ranks_per_machine > devices ? 1.0f : 0.0f;
  comm.allreduce(counts + 1, 1, ReduceOp::kSum);
  const bool gpus_shared = counts[1] > 0.0f;
  if (config.comm.backend == "nccl") {
    FT_REQUIRE(!gpus_shared, "comm.backend: nccl needs one GPU per rank, but ", ranks_per_machine,
               " ranks share ", devices,
               " GPU(s) on a machine (NCCL refuses two ranks on one "
               "device); run fewer ranks per machine or use comm.backend: mpi");
    FT_REQUIRE(!config.comm.deterministic,
               "comm.deterministic: true needs comm.backend: mpi "
               "(NCCL has no rank-order sum); set comm.backend: mpi or auto");
    return "nccl";
  }
  return gpus_shared || config.comm.deterministic ? "mpi" : "nccl";
}

std::unique_ptr<Communicator> make_device_communicator() {
#if defined(FT_HAVE_CUDA)
  return make_nccl_communicator(cuda_context().compute_stream());
#else
  FT_FAIL("comm.backend: nccl needs a build with the CUDA path");
#endif
}

}  // namespace ft

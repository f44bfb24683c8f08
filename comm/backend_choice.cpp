#include "comm/backend_choice.h"

#include <algorithm>

#include "core/check.h"

#if defined(FT_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "comm/nccl/nccl_communicator.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_context.h"
#endif

namespace ft {

std::string choose_gradient_backend(const GradientBackendRequest& request, Communicator& comm) {
  if (request.device != "cuda" || request.backend == "mpi") return "mpi";
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
  if (request.backend == "nccl") {
    FT_REQUIRE(!gpus_shared, "comm.backend: nccl needs one GPU per rank, but ", ranks_per_machine,
               " ranks share ", devices,
               " GPU(s) on a machine (NCCL refuses two ranks on one "
               "device); run fewer ranks per machine or use comm.backend: mpi");
    FT_REQUIRE(!request.deterministic,
               "comm.deterministic: true needs comm.backend: mpi "
               "(NCCL has no rank-order sum); set comm.backend: mpi or auto");
    return "nccl";
  }
  return gpus_shared || request.deterministic ? "mpi" : "nccl";
}

std::unique_ptr<Communicator> make_device_communicator() {
#if defined(FT_HAVE_CUDA)
  return make_nccl_communicator(cuda_context().compute_stream());
#else
  FT_FAIL("comm.backend: nccl needs a build with the CUDA path");
#endif
}

}  // namespace ft

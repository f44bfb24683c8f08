// Which backend reduces the gradient buckets, and the device communicator it needs. The app
// translates its config into a GradientBackendRequest; the choice itself is comm/'s.
// Thread safety: call from the main thread.
#pragma once
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace ft {

// The settings the choice reads (train.device, comm.backend, comm.deterministic).
struct GradientBackendRequest {
  std::string device;   // "cpu" or "cuda"
  std::string backend;  // "auto", "mpi" or "nccl"
  bool deterministic = false;
};

// "mpi" or "nccl". Backend auto picks nccl for cuda when every rank on a machine has a GPU of its
// own (NCCL refuses two ranks on one device) and deterministic is off (NCCL has no rank-order
// sum); mpi otherwise, which stages cuda gradients through pinned host memory. An explicit nccl
// that cannot work is a user error naming comm.backend. Collective over `comm` (a host backend)
// for cuda: every rank calls it.
std::string choose_gradient_backend(const GradientBackendRequest& request, Communicator& comm);

// NCCL over every MPI rank, ordered against the compute stream (collective). Builds without CUDA
// never get here: setup_device refused cuda already.
std::unique_ptr<Communicator> make_device_communicator();

}  // namespace ft

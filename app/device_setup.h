// train.device for this process: cpu, or cuda once a GPU is known to be usable. Called at the
// start of every job that computes (train, bench, tune, eval), so `train.device: cuda` on a
// machine without a GPU, or with a build without the CUDA path, stops with one clear sentence
// before any data is read.
// Thread safety: call from the main thread, before any tensor is made on the device.
#pragma once
#include <memory>
#include <string>

#include "app/config.h"
#include "comm/communicator.h"
#include "core/device.h"

namespace ft {

// cpu: nothing to do. cuda: throws a user error (no source path) when no device can be used;
// otherwise selects this rank's GPU (local_rank modulo the devices) and applies train.tf32.
Device setup_device(const Config& config, int local_rank);
// The same for a job without a config: `device` is "cpu" or "cuda" as `setting` names it
// ("infer --device"); `instead` is what the error suggests ("--device cpu"). Throws a user error
// for any other name.
Device setup_device(const std::string& device, const std::string& setting,
                    const std::string& instead, int local_rank);

// The backend the gradient buckets are reduced with, "mpi" or "nccl". comm.backend auto picks
// nccl for cuda when every rank on a machine has a GPU of its own (NCCL refuses two ranks on one
// device) and comm.deterministic is off (NCCL has no rank-order sum); mpi otherwise, which
// stages cuda gradients through pinned host memory. An explicit nccl that cannot work is a user
// error. Collective over `comm` (a host backend) for cuda: every rank calls it.
std::string gradient_backend(const Config& config, Communicator& comm);

// NCCL over every MPI rank, ordered against the compute stream (collective). Builds without CUDA
// never get here: setup_device refused cuda already.
std::unique_ptr<Communicator> make_device_communicator();

}  // namespace ft

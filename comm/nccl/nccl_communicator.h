// NCCL backend of ft::Communicator, for float and bf16 buffers in CUDA device memory. One process
// drives one GPU, its CUDA context's; the NCCL unique id travels from rank 0 to the others over
// MPI_COMM_WORLD.
// Collectives run on the communicator's own non-blocking stream, ordered after the work already
// enqueued on the compute stream (via an event), so gradient buckets can reduce while the
// backward pass keeps computing.
//
// Completion contract (device memory cannot be "ready" for every reader at once):
//  - allreduce, broadcast and barrier return once the result is in device memory (host blocks).
//  - allreduce_async's handle: wait() makes the compute stream wait for the reduction, without
//    blocking the host; work enqueued on the compute stream afterwards sees the result. A reader
//    on another stream or the host must synchronise the compute stream first. test() never blocks.
// Thread safety: one thread at a time per communicator (NCCL's rule); a handle may be waited on
// from the thread that made it.
#pragma once
#include <cuda_runtime_api.h>

#include <memory>

#include "comm/communicator.h"

namespace ft {

// Creates the NCCL communicator over all MPI ranks (collective: every rank must call it) and its
// communication stream, on the GPU of this process's cuda_context() (core/cuda/cuda_context.h),
// the one device-selection path: select_cuda_device(local rank) before the first cuda_context(),
// as setup_device does. Throws ft::Error on every rank when any rank's context cannot be made, or
// when two ranks of one machine drive the same GPU (NCCL needs one GPU per rank).
// REQUIRES: MPI is initialised; compute_stream (null = legacy default stream) belongs to
//           cuda_context()'s device (normally it is cuda_context().compute_stream()).
std::unique_ptr<Communicator> make_nccl_communicator(cudaStream_t compute_stream);

}  // namespace ft

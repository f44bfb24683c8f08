// NCCL backend of ft::Communicator, for float buffers in CUDA device memory. One process drives
// one GPU; the NCCL unique id travels from rank 0 to the others over MPI_COMM_WORLD.
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

// Picks this process's GPU and makes it current (cudaSetDevice): OMPI_COMM_WORLD_LOCAL_RANK when
// mpirun sets it, else the MPI world rank modulo the device count. Call it before creating the
// compute stream. Returns the device index. Throws ft::Error when no device fits.
// REQUIRES: MPI is initialised.
int select_local_cuda_device();

// Selects the device as above, creates the NCCL communicator over all MPI ranks (collective:
// every rank must call it) and its communication stream.
// REQUIRES: MPI is initialised; compute_stream (null = legacy default stream) belongs to the
//           device select_local_cuda_device() picks; one rank per GPU (NCCL rejects two ranks on
//           one device).
std::unique_ptr<Communicator> make_nccl_communicator(cudaStream_t compute_stream);

}  // namespace ft

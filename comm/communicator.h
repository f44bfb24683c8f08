// Communicator: the narrow interface every collective backend implements (MPI for CPU tensors,
// NCCL for CUDA tensors). Algorithms such as gradient bucketing only see this interface.
// Thread safety: a Communicator is used by one thread at a time (the training thread, or the
// communication thread it hands work to); handles may be waited on from the thread that made them.
#pragma once
#include <cstddef>
#include <memory>

#include "core/check.h"
#include "core/math/bf16_math.h"
#include "core/tensor.h"

namespace ft {

enum class ReduceOp { kSum, kAverage };

// The order in which a sum-allreduce adds the ranks' values.
enum class Summation {
  // The library's own tuned, topology-aware algorithm (MPI_Allreduce / MPI_Iallreduce,
  // ncclAllReduce). With three or more ranks it picks its algorithm, and so the order of additions
  // and the last bits of the result, by message size: bucketing changes rounding.
  kNative,
  // Every element becomes ((x_0 + x_1) + x_2) + ... in rank order, whatever the message size, so
  // bucketing never changes a bit. MPI only: from three ranks a point-to-point fold
  // (comm/mpi/fold_allreduce.h) that knows nothing of the network's topology.
  kRankOrder,
};

// Options of one allreduce. A bare ReduceOp converts to {op, Summation::kNative}.
struct AllreduceOptions {
  AllreduceOptions(ReduceOp op = ReduceOp::kSum,  // NOLINT(google-explicit-constructor)
                   Summation summation = Summation::kNative)
      : op(op), summation(summation) {}
  ReduceOp op;          // kAverage is the sum followed by one scale pass by 1 / size()
  Summation summation;  // how the sum is ordered; see Summation
};

// An in-flight async collective. wait() blocks until the buffer holds the result.
class CommHandle {
 public:
  virtual ~CommHandle() = default;
  virtual void wait() = 0;
  // True once complete; never blocks.
  virtual bool test() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;
  virtual const char* backend_name() const = 0;
  // Where the buffers of allreduce and broadcast must live: host memory for MPI, device memory for
  // NCCL. GradSync stages device gradients through pinned host memory for a host backend.
  virtual Device buffer_device() const { return Device::kCpu; }

  // In place over `count` floats at `buffer` (host memory for MPI, device memory for NCCL).
  // Every rank must pass the same options. Throws ft::Error for a Summation the backend lacks.
  virtual void allreduce(float* buffer, size_t count, const AllreduceOptions& options) = 0;
  // REQUIRES: `buffer` is neither read nor written until the handle's wait() returns.
  virtual std::unique_ptr<CommHandle> allreduce_async(float* buffer, size_t count,
                                                      const AllreduceOptions& options) = 0;
  // The bf16 twins (comm.grad_dtype: bf16): `count` bf16 bit patterns (core/math/bf16_math.h) at
  // `buffer`, half the bytes of the float calls, same contracts. Every addition of two values is
  // done in fp32 and rounded once to bf16 (so one rounding per hop of the backend's algorithm);
  // kAverage rounds once more after its scale. Backends opt in: the defaults throw ft::Error.
  virtual void allreduce_bf16(bf16_bits* /*buffer*/, size_t /*count*/,
                              const AllreduceOptions& /*options*/) {
    FT_FAIL("the ", backend_name(),
            " communicator has no bf16 allreduce; use comm.grad_dtype fp32");
  }
  virtual std::unique_ptr<CommHandle> allreduce_bf16_async(bf16_bits* /*buffer*/, size_t /*count*/,
                                                           const AllreduceOptions& /*options*/) {
    FT_FAIL("the ", backend_name(),
            " communicator has no bf16 allreduce; use comm.grad_dtype fp32");
  }
  virtual void broadcast(float* buffer, size_t count, int root) = 0;
  virtual void barrier() = 0;

  // How long a blocking wait on the other ranks may take before this rank reports a stalled or
  // dead peer and exits (comm.timeout_s; comm/collective_watchdog.h); 0 waits for ever. Backends
  // without a watchdog (NCCL for now) ignore it.
  virtual void set_timeout_s(double /*seconds*/) {}
};

}  // namespace ft

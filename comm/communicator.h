// Communicator: the narrow interface every collective backend implements (MPI for CPU tensors,
// NCCL for CUDA tensors). Algorithms such as gradient bucketing only see this interface.
// Thread safety: a Communicator is used by one thread at a time (the training thread, or the
// communication thread it hands work to); handles may be waited on from the thread that made them.
#pragma once
#include <cstddef>
#include <memory>

namespace ft {

enum class ReduceOp { kSum, kAverage };

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

  // In place over `count` floats at `buffer` (host memory for MPI, device memory for NCCL).
  virtual void allreduce(float* buffer, size_t count, ReduceOp op) = 0;
  // REQUIRES: `buffer` is neither read nor written until the handle's wait() returns.
  virtual std::unique_ptr<CommHandle> allreduce_async(float* buffer, size_t count, ReduceOp op) = 0;
  virtual void broadcast(float* buffer, size_t count, int root) = 0;
  virtual void barrier() = 0;
};

}  // namespace ft

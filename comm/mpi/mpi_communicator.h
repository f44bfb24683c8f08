// MpiCommunicator: the Communicator backend for host (CPU) buffers over MPI. It works on a private
// duplicate of MPI_COMM_WORLD so its collectives never match anyone else's. By default sums are
// folded in rank order (FoldAllreduce, used from three ranks up; two ranks add exactly one pair,
// so MPI_Allreduce is already exact there), so results are bitwise independent of how gradients
// are bucketed; kNative always uses MPI_Allreduce, whose rounding depends on the message size
// with three or more ranks. kAverage is a sum followed by one scale pass.
// Thread safety: MPI calls happen on whichever thread calls in; callers serialise them (the
// runtime grants MPI_THREAD_SERIALIZED), as the Communicator contract already requires.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "comm/communicator.h"

namespace ft {

enum class MpiReduction {
  kFixedOrder,  // ((x_0 + x_1) + x_2) + ... for every element, whatever the message size
  kNative,      // MPI_Allreduce / MPI_Iallreduce as the MPI library implements them
};

class MpiCommunicator final : public Communicator {
 public:
  // REQUIRES: MPI is initialised (an MpiRuntime is alive) and outlives this object.
  // Collective over MPI_COMM_WORLD.
  explicit MpiCommunicator(MpiReduction reduction = MpiReduction::kFixedOrder);
  ~MpiCommunicator() override;  // frees the duplicated communicator; never throws
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Rank among the processes on this node (MPI_COMM_TYPE_SHARED).
  int local_rank() const override { return local_rank_; }
  const char* backend_name() const override { return "mpi"; }

  void allreduce(float* buffer, size_t count, ReduceOp op) override;
  std::unique_ptr<CommHandle> allreduce_async(float* buffer, size_t count, ReduceOp op) override;
  void broadcast(float* buffer, size_t count, int root) override;
  void barrier() override;

  MPI_Comm mpi_comm() const { return comm_; }
  MpiReduction reduction() const { return reduction_; }

 private:
  bool folds() const;

  MpiReduction reduction_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  std::vector<float> scratch_;  // FoldAllreduce's receive area for blocking calls
  int64_t next_sequence_ = 0;   // FoldAllreduce operations started, the same on every rank
};

}  // namespace ft

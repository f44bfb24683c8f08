// MpiCommunicator: the Communicator backend for host (CPU) buffers over MPI. It works on a private
// duplicate of MPI_COMM_WORLD so its collectives never match anyone else's. Summation::kNative (the
// default) is the MPI library's own MPI_Allreduce / MPI_Iallreduce, tuned for the network and
// topology; its rounding depends on the message size with three or more ranks.
// Summation::kRankOrder folds sums in rank order (FoldAllreduce, used from three ranks up; two
// ranks add exactly one pair, so MPI_Allreduce is already exact there), so results are bitwise
// independent of how gradients are bucketed. kAverage is a sum followed by one scale pass.
// bf16 buffers reduce with a user-defined MPI reduction (comm/mpi/bf16_reduction.h), or fold in
// rank order like floats.
// Every blocking wait is watched (comm/collective_watchdog.h): one that outlives comm.timeout_s
// ends the process with a report instead of hanging.
// Thread safety: MPI calls happen on whichever thread calls in; callers serialise them (the
// runtime grants MPI_THREAD_SERIALIZED), as the Communicator contract already requires.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/collective_watchdog.h"
#include "comm/communicator.h"
#include "comm/mpi/bf16_reduction.h"

namespace ft {

class MpiCommunicator final : public Communicator {
 public:
  // REQUIRES: MPI is initialised (an MpiRuntime is alive) and outlives this object.
  // Collective over MPI_COMM_WORLD.
  MpiCommunicator();
  ~MpiCommunicator() override;  // frees the duplicated communicator; never throws
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Rank among the processes on this node (MPI_COMM_TYPE_SHARED).
  int local_rank() const override { return local_rank_; }
  const char* backend_name() const override { return "mpi"; }

  void allreduce(float* buffer, size_t count, const AllreduceOptions& options) override;
  std::unique_ptr<CommHandle> allreduce_async(float* buffer, size_t count,
                                              const AllreduceOptions& options) override;
  void allreduce_bf16(bf16_bits* buffer, size_t count, const AllreduceOptions& options) override;
  std::unique_ptr<CommHandle> allreduce_bf16_async(bf16_bits* buffer, size_t count,
                                                   const AllreduceOptions& options) override;
  void broadcast(float* buffer, size_t count, int root) override;
  void barrier() override;
  void set_timeout_s(double seconds) override { watchdog_->set_timeout_s(seconds); }

  MPI_Comm mpi_comm() const { return comm_; }
  // Every blocking wait on mpi_comm() holds one of these (comm/gather.cpp's too).
  CollectiveWatchdog& watchdog() { return *watchdog_; }

 private:
  // True when `summation` needs FoldAllreduce rather than the library's call.
  bool folds(Summation summation) const;
  // The float and bf16 calls share one body; these pick the element's MPI type, sum and scratch.
  template <typename T>
  void allreduce_of(T* buffer, size_t count, const AllreduceOptions& options);
  template <typename T>
  std::unique_ptr<CommHandle> allreduce_async_of(T* buffer, size_t count,
                                                 const AllreduceOptions& options);
  MPI_Datatype mpi_type(const float*) const;
  MPI_Datatype mpi_type(const bf16_bits*) const;
  MPI_Op mpi_sum(const float*) const;
  MPI_Op mpi_sum(const bf16_bits*) const;
  std::vector<float>& scratch(const float*);
  std::vector<bf16_bits>& scratch(const bf16_bits*);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  std::unique_ptr<CollectiveWatchdog> watchdog_;  // created once rank_ is known
  std::unique_ptr<Bf16Reduction> bf16_;           // the bf16 datatype and sum
  std::vector<float> scratch_;                    // FoldAllreduce's receive area for blocking calls
  std::vector<bf16_bits> scratch_bf16_;           // the same for bf16 folds
  int64_t next_sequence_ = 0;  // FoldAllreduce operations started, the same on every rank
};

}  // namespace ft

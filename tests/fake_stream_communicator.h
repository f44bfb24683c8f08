// Test doubles for GradSync's two communicators, on the CPU. FakeStreamCommunicator stands for
// NCCL: allreduce_async only records the launch (as NCCL enqueues on its stream after an event on
// the compute stream), and the sum lands in the buffer only when the handle's wait() runs (as the
// compute stream's wait on the done event). HostRanks stands for the MPI communicator of the same
// ranks. Their blocking calls check the capture guard (core/capture_guard.h) as the real ones do.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/capture_guard.h"

namespace ft {
namespace test {

// `ranks` identical ranks: a sum is the local value times `ranks`.
class FakeStreamCommunicator : public Communicator {
 public:
  explicit FakeStreamCommunicator(int ranks) : ranks_(ranks) {}
  int rank() const override { return 0; }
  int size() const override { return ranks_; }
  int local_rank() const override { return 0; }
  const char* backend_name() const override { return "fake-stream"; }
  Device buffer_device() const override { return Device::kCuda; }

  // Blocking calls on device memory are never GradSync's business on this path: its host
  // messages go to the host communicator. Recorded, so a test sees a stray one.
  void allreduce(float*, size_t, const AllreduceOptions&) override {
    require_not_capturing("FakeStreamCommunicator::allreduce (blocking)");
    events.push_back("blocking allreduce");
  }
  std::unique_ptr<CommHandle> allreduce_async(float* buffer, size_t count,
                                              const AllreduceOptions& options) override {
    events.push_back("launch " + std::to_string(count));
    return std::make_unique<Handle>(this, buffer, count, options);
  }
  void broadcast(float*, size_t, int) override {
    require_not_capturing("FakeStreamCommunicator::broadcast (blocking)");
    events.push_back("blocking broadcast");
  }
  void barrier() override {}
  void sum_in_place(float* buffer, size_t count) const {
    for (size_t i = 0; i < count; ++i) buffer[i] *= static_cast<float>(ranks_);
  }

  std::vector<std::string> events;

 private:
  class Handle : public CommHandle {
   public:
    Handle(FakeStreamCommunicator* comm, float* buffer, size_t count, AllreduceOptions)
        : comm_(comm), buffer_(buffer), count_(count) {}
    void wait() override {
      if (done_) return;
      comm_->events.push_back("wait " + std::to_string(count_));
      comm_->sum_in_place(buffer_, count_);
      done_ = true;
    }
    bool test() override { return done_; }

   private:
    FakeStreamCommunicator* comm_;
    float* buffer_;
    size_t count_;
    bool done_ = false;
  };
  int ranks_;
};

// The MPI communicator of the same ranks, for GradSync's host messages (identical ranks).
class HostRanks : public Communicator {
 public:
  explicit HostRanks(int ranks) : ranks_(ranks) {}
  int rank() const override { return 0; }
  int size() const override { return ranks_; }
  int local_rank() const override { return 0; }
  const char* backend_name() const override { return "host"; }
  void allreduce(float* buffer, size_t count, const AllreduceOptions&) override {
    require_not_capturing("HostRanks::allreduce (blocking, as MpiCommunicator's)");
    for (size_t i = 0; i < count; ++i) buffer[i] *= static_cast<float>(ranks_);
  }
  std::unique_ptr<CommHandle> allreduce_async(float*, size_t, const AllreduceOptions&) override {
    return nullptr;
  }
  void broadcast(float*, size_t, int) override {
    require_not_capturing("HostRanks::broadcast (blocking, as MpiCommunicator's)");
  }
  void barrier() override {}

 private:
  int ranks_;
};

}  // namespace test
}  // namespace ft

// CollectiveWatchdog: turns a collective that never completes into an error instead of a hang.
// A rank that stalls (stopped, deadlocked, stuck on a dead disk) or dies without its launcher
// noticing leaves every other rank blocked inside MPI for ever. Around each blocking wait the
// communicator arms the watchdog; if the wait is still armed after the timeout, the watchdog's
// own thread reports it on stderr, naming the collective, its size and the config key, and ends
// the process without another MPI call (the waiting thread holds MPI). mpirun sees a rank exit
// without MPI_Finalize and stops the job. This is PyTorch's NCCL watchdog idea
// (TORCH_NCCL_ASYNC_ERROR_HANDLING), for MPI.
// Thread safety: arm/disarm from one thread (the one that waits); the watchdog thread only reads
// under the mutex.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace ft {

class CollectiveWatchdog {
 public:
  // What happens when a wait outlives the timeout: gets the report; the default prints it to
  // stderr and calls std::_Exit(kExitCode). Tests pass a recorder instead.
  using OnTimeout = std::function<void(const std::string& report)>;
  static constexpr int kExitCode = 1;

  // rank: printed in the report. No thread runs until the first armed wait with a timeout set.
  explicit CollectiveWatchdog(int rank, OnTimeout on_timeout = nullptr);
  ~CollectiveWatchdog();  // stops and joins the thread; never throws
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // Seconds a wait may block; 0 turns the watchdog off. REQUIRES: no wait is armed.
  void set_timeout_s(double seconds);
  double timeout_s() const { return timeout_s_; }

  // Arms the watchdog for one blocking wait, from construction to destruction.
  class Scope {
   public:
    // what: the collective, as "allreduce" or "broadcast"; count: its floats (0 if none).
    // REQUIRES: no other Scope of this watchdog is alive (waits do not nest; throws otherwise).
    Scope(CollectiveWatchdog& watchdog, const char* what, size_t count);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CollectiveWatchdog* watchdog_;  // null when the watchdog is off
  };

 private:
  void arm(const char* what, size_t count);
  void disarm();
  void watch();  // the thread's loop

  const int rank_;
  OnTimeout on_timeout_;
  double timeout_s_ = 0;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool armed_ = false;  // guarded by mutex_, as are the three below
  bool stopping_ = false;
  std::chrono::steady_clock::time_point deadline_;
  std::string what_;
  std::thread thread_;
};

}  // namespace ft

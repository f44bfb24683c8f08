// CommThread: one worker thread that runs communication jobs strictly in submission order, so
// collectives launched during backward progress while the training thread keeps computing (MPI
// only progresses inside MPI calls, and this thread sits in them). Every MPI call of an
// overlapped step is made here; the training thread makes none until wait() has returned, and the
// queue mutex orders the two threads' calls, which is all MPI_THREAD_SERIALIZED asks.
// Thread safety: submit() and wait() are called by one owner thread; jobs run on the worker.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace ft {

class CommThread {
 public:
  using Job = std::function<void()>;

  CommThread();
  // Drops jobs not yet started, lets the running one finish, joins. Never throws.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `job` behind every job submitted before it; returns its ticket (1, 2, ...).
  int64_t submit(Job job);
  // Blocks until the job with `ticket` has run. Rethrows the first exception any job threw; after
  // a failure the remaining jobs are skipped, since the collective sequence is broken anyway.
  void wait(int64_t ticket);

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable job_done_;
  std::deque<Job> queue_;
  int64_t submitted_ = 0;
  int64_t completed_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread worker_;  // last: starts after every other member exists
};

}  // namespace ft

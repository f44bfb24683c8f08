#include "comm/comm_thread.h"

#include "core/check.h"

namespace ft {

CommThread::CommThread() : worker_([this] { run(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  work_ready_.notify_all();
  if (worker_.joinable()) worker_.join();
}

int64_t CommThread::submit(Job job) {
  int64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    FT_CHECK(!stopping_, "CommThread::submit after shutdown");
    queue_.push_back(std::move(job));
    ticket = ++submitted_;
  }
  work_ready_.notify_one();
  return ticket;
}

void CommThread::wait(int64_t ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  FT_CHECK(ticket >= 1 && ticket <= submitted_, "CommThread::wait on unknown ticket ", ticket);
  job_done_.wait(lock, [&] { return completed_ >= ticket || error_ != nullptr; });
  if (error_) std::rethrow_exception(error_);
}

void CommThread::run() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr failure;
    try {
      job();
    } catch (...) {
      failure = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++completed_;
      if (failure && !error_) error_ = failure;
      if (error_) queue_.clear();
    }
    job_done_.notify_all();
  }
}

}  // namespace ft

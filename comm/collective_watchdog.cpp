#include "comm/collective_watchdog.h"

#include <cstdio>
#include <cstdlib>

#include "core/check.h"

namespace ft {

CollectiveWatchdog::CollectiveWatchdog(int rank, OnTimeout on_timeout)
    : rank_(rank), on_timeout_(std::move(on_timeout)) {
  if (!on_timeout_) {
    on_timeout_ = [](const std::string& report) {
      std::fprintf(stderr, "%s\n", report.c_str());
      std::fflush(stderr);
      std::_Exit(kExitCode);
    };
  }
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CollectiveWatchdog::set_timeout_s(double seconds) {
  FT_CHECK(seconds >= 0, "collective timeout must be >= 0, got ", seconds);
  std::lock_guard<std::mutex> lock(mutex_);
  FT_CHECK(!armed_, "collective timeout changed during a wait");
  timeout_s_ = seconds;
}

CollectiveWatchdog::Scope::Scope(CollectiveWatchdog& watchdog, const char* what, size_t count)
    : watchdog_(watchdog.timeout_s_ > 0 ? &watchdog : nullptr) {
  if (watchdog_ != nullptr) watchdog_->arm(what, count);
}

CollectiveWatchdog::Scope::~Scope() {
  if (watchdog_ != nullptr) watchdog_->disarm();
}

void CollectiveWatchdog::arm(const char* what, size_t count) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // One deadline at a time: an inner wait's end would disarm the outer one.
    FT_CHECK(!armed_, "collective watchdog: a ", what, " began inside the wait of ", what_,
             " (watched waits do not nest)");
    armed_ = true;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(timeout_s_));
    what_ = count > 0 ? std::string(what) + " of " + std::to_string(count) + " floats" : what;
    if (!thread_.joinable()) thread_ = std::thread([this] { watch(); });
  }
  changed_.notify_all();
}

void CollectiveWatchdog::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
}

void CollectiveWatchdog::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (!armed_) {
      changed_.wait(lock, [this] { return stopping_ || armed_; });
      continue;
    }
    const auto deadline = deadline_;
    // Wakes at the deadline, or when the wait ends or a new one starts (then re-reads both).
    if (changed_.wait_until(lock, deadline,
                            [&] { return stopping_ || !armed_ || deadline_ != deadline; }))
      continue;
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%g", timeout_s_);
    const std::string report =
        "rank " + std::to_string(rank_) + ": error: " + what_ + " has waited " + seconds +
        " s for the other ranks (comm.timeout_s): one of them has stalled or died; this rank "
        "exits so that mpirun stops the job";
    armed_ = false;
    lock.unlock();
    on_timeout_(report);
    lock.lock();
  }
}

}  // namespace ft

// CollectiveWatchdog (comm/collective_watchdog.h): a wait that outlives the timeout is reported
// once, naming the rank, the collective and the config key; waits that end in time, and a
// watchdog that is off, report nothing. A recorder stands in for the default exit.
#include "comm/collective_watchdog.h"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"

namespace ft {
namespace {

class Reports {
 public:
  CollectiveWatchdog::OnTimeout recorder() {
    return [this](const std::string& report) {
      std::lock_guard<std::mutex> lock(mutex_);
      reports_.push_back(report);
    };
  }
  std::vector<std::string> get() {
    std::lock_guard<std::mutex> lock(mutex_);
    return reports_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> reports_;
};

void sleep_s(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

// One watched wait that blocks for `seconds`.
void wait_watched(CollectiveWatchdog& watchdog, const char* what, size_t count, double seconds) {
  CollectiveWatchdog::Scope watched(watchdog, what, count);
  sleep_s(seconds);
}

TEST(CollectiveWatchdog, AWaitPastTheTimeoutIsReportedOnceWithWhatAndWhere) {
  Reports reports;
  CollectiveWatchdog watchdog(3, reports.recorder());
  watchdog.set_timeout_s(0.1);
  wait_watched(watchdog, "allreduce", 1024, 0.5);
  const std::vector<std::string> got = reports.get();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_NE(got[0].find("rank 3: error: allreduce of 1024 floats has waited 0.1 s"),
            std::string::npos)
      << got[0];
  EXPECT_NE(got[0].find("comm.timeout_s"), std::string::npos) << got[0];
}

TEST(CollectiveWatchdog, WaitsThatEndInTimeAreNotReportedAndALaterLongOneIs) {
  Reports reports;
  CollectiveWatchdog watchdog(0, reports.recorder());
  watchdog.set_timeout_s(0.2);
  for (int wait = 0; wait < 30; ++wait)  // 0.3 s of short waits in all: each ends in time
    wait_watched(watchdog, "broadcast", 8, 0.01);
  sleep_s(0.3);  // disarmed: time outside a wait never counts
  EXPECT_TRUE(reports.get().empty());
  wait_watched(watchdog, "barrier", 0, 0.5);
  const std::vector<std::string> got = reports.get();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_NE(got[0].find("rank 0: error: barrier has waited 0.2 s"), std::string::npos) << got[0];
}

TEST(CollectiveWatchdog, ZeroTimeoutWaitsForEver) {
  Reports reports;
  CollectiveWatchdog watchdog(1, reports.recorder());
  watchdog.set_timeout_s(0);
  wait_watched(watchdog, "allreduce", 1, 0.3);
  EXPECT_TRUE(reports.get().empty());
}

TEST(CollectiveWatchdog, NestedWaitsAreRefused) {
  Reports reports;
  CollectiveWatchdog watchdog(2, reports.recorder());
  watchdog.set_timeout_s(5);
  CollectiveWatchdog::Scope outer(watchdog, "allreduce", 4);
  EXPECT_THROW(CollectiveWatchdog::Scope inner(watchdog, "broadcast", 4), Error);
}

}  // namespace
}  // namespace ft

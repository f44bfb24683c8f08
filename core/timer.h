// Wall-clock timing helpers: a monotonic clock in milliseconds and a per-name accumulator that the
// executor uses for per-op time.
// Thread safety: Stopwatch is a value; TimeTable is not synchronised (one owner thread).
#pragma once
#include <chrono>
#include <map>
#include <string>

namespace ft {

inline double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

struct TimeEntry {
  double total_ms = 0;
  long calls = 0;
};

class TimeTable {
 public:
  void add(const std::string& name, double ms) {
    TimeEntry& entry = entries_[name];
    entry.total_ms += ms;
    ++entry.calls;
  }
  const std::map<std::string, TimeEntry>& entries() const { return entries_; }
  void clear() { entries_.clear(); }

 private:
  std::map<std::string, TimeEntry> entries_;
};

}  // namespace ft

#include "comm/emulated_link.h"

#include <chrono>
#include <thread>

#include "core/timer.h"

namespace ft {

double EmulatedLink::extra_us(int64_t bytes) const {
  double us = latency_us;
  if (bandwidth_gbps > 0) us += static_cast<double>(bytes) / (bandwidth_gbps * 1e9 / 8.0) * 1e6;
  return us;
}

void emulate_link_delay(const EmulatedLink& link, int64_t bytes, double real_end_ms) {
  if (!link.enabled()) return;
  const double deadline_ms = real_end_ms + link.extra_us(bytes) / 1000.0;
  // sleep_for never wakes early, but may wake a little late; the recorded duration is measured
  // afterwards, so the stats include any oversleep rather than pretending it was exact.
  const double remaining_ms = deadline_ms - now_ms();
  if (remaining_ms > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(remaining_ms));
  }
}

}  // namespace ft

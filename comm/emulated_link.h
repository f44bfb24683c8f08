// EmulatedLink: a slower network than the one we have, modelled as α + bytes/β added on top of each
// real allreduce, so bucketing and overlap can be studied on one machine whose shared-memory
// "network" is far faster than a cluster's. bytes is the payload of the allreduce (the buffer size,
// i.e. algorithm-bandwidth bytes, not bus bytes), so β is the algbw the emulated link delivers.
// Any number produced with it on must be labelled "emulated link" (CommStepStats::emulated).
// Thread safety: EmulatedLink is a value; emulate_link_delay only sleeps the calling thread.
#pragma once
#include <cstdint>

namespace ft {

struct EmulatedLink {
  double latency_us = 0;      // α, added once per allreduce
  double bandwidth_gbps = 0;  // β in Gbit/s (1e9 bits/s); 0 = no bandwidth term
  bool enabled() const { return latency_us > 0 || bandwidth_gbps > 0; }
  // α + bytes/β in microseconds.
  double extra_us(int64_t bytes) const;
};

// Sleeps until `real_end_ms` (now_ms() when the real allreduce returned) + link.extra_us(bytes).
// REQUIRES: latency_us >= 0, bandwidth_gbps >= 0 (checked in GradSync's constructor).
void emulate_link_delay(const EmulatedLink& link, int64_t bytes, double real_end_ms);

}  // namespace ft

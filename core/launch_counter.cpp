#include "core/launch_counter.h"

#include <atomic>

namespace ft {
namespace {

// Relaxed: the counts order nothing; only their values matter, read after the step they count.
std::atomic<int64_t> counters[5];

std::atomic<int64_t>& counter(LaunchKind kind) {
  return counters[static_cast<int>(kind)];
}

int64_t read(LaunchKind kind) {
  return counter(kind).load(std::memory_order_relaxed);
}

}  // namespace

LaunchCounts operator-(const LaunchCounts& after, const LaunchCounts& before) {
  LaunchCounts delta;
  delta.kernels = after.kernels - before.kernels;
  delta.gemms = after.gemms - before.gemms;
  delta.convolutions = after.convolutions - before.convolutions;
  delta.copies = after.copies - before.copies;
  delta.graphs = after.graphs - before.graphs;
  return delta;
}

LaunchCounts& operator+=(LaunchCounts& sum, const LaunchCounts& more) {
  sum.kernels += more.kernels;
  sum.gemms += more.gemms;
  sum.convolutions += more.convolutions;
  sum.copies += more.copies;
  sum.graphs += more.graphs;
  return sum;
}

LaunchCounts launch_counts() {
  LaunchCounts counts;
  counts.kernels = read(LaunchKind::kKernel);
  counts.gemms = read(LaunchKind::kGemm);
  counts.convolutions = read(LaunchKind::kConvolution);
  counts.copies = read(LaunchKind::kCopy);
  counts.graphs = read(LaunchKind::kGraph);
  return counts;
}

void count_launch(LaunchKind kind) {
  counter(kind).fetch_add(1, std::memory_order_relaxed);
}

}  // namespace ft

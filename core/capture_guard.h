// The capture guard: while this thread captures a CUDA graph (CudaGraph::begin_capture ... end_
// or abort_capture), every path that would make the host wait for the device or for other ranks
// (a device-to-host copy, a scalar read such as Executor::loss, a stream synchronise, a blocking
// collective) throws instead. Inside a capture such a call either fails with a CUDA error far from
// its cause or, worse, reads a value the graph has not computed yet. The flag is plain host state,
// so the CPU tests run the captured step's sequence under it (tests/capture_guard_test.cpp).
// Thread safety: the flag is thread-local, as a stream capture belongs to the capturing thread.
#pragma once

namespace ft {

// REQUIRES: not already capturing when turning it on (captures do not nest).
void set_capturing(bool on);
bool capturing();

// Throws ft::Error naming `what` when this thread is capturing; a no-op otherwise.
void require_not_capturing(const char* what);

// Turns the flag on for a scope (tests; CudaGraph sets it by hand around its capture).
class CapturingScope {
 public:
  CapturingScope() { set_capturing(true); }
  ~CapturingScope() { set_capturing(false); }
  CapturingScope(const CapturingScope&) = delete;
  CapturingScope& operator=(const CapturingScope&) = delete;
};

}  // namespace ft

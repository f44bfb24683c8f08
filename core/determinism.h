// Pinned deterministic algorithms for the CUDA libraries, for runs that must give the same bits
// twice (tests comparing a CUDA-graph replay with eager steps, or one run with another). When on:
// cuBLASLt is offered no split-K reduction (every output element is summed by one thread block in
// one order), and cuDNN's candidate lists hold only the algorithms it reports deterministic. Off
// by default: cuDNN still prefers deterministic algorithms then, but takes another rather than
// fail, and cuBLASLt may split K. Part of both plan caches' keys, so toggling it never reuses a
// plan made under the other setting. The CPU kernels are deterministic either way.
// Thread safety: set it before the training thread's first kernel; read from that thread.
#pragma once

namespace ft {

void set_deterministic_algorithms(bool on);
bool deterministic_algorithms();

}  // namespace ft

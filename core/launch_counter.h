// Process-wide counts of the device work fusiontrain issues: our own kernel launches (counted by
// FT_CUDA_CHECK_LAUNCH, which follows every `<<<...>>>`), cuBLASLt matmuls, cuDNN convolutions and
// async copies or fills. They exist so `fusiontrain bench` can show launches per step: an unfused
// twin launches one kernel per eager op, and the bench reads the delta of a snapshot taken around
// each of a variant's timed steps. Always compiled (no CUDA header), so CPU builds read zeros.
// Thread safety: any thread may count or snapshot (relaxed atomics, which order nothing). A step
// counts what its comm thread issues too (host-staged bucket copies), since the step waits for it.
#pragma once
#include <cstdint>

namespace ft {

enum class LaunchKind { kKernel, kGemm, kConvolution, kCopy, kGraph };

struct LaunchCounts {
  int64_t kernels = 0;       // our __global__ kernels
  int64_t gemms = 0;         // cublasLtMatmul calls
  int64_t convolutions = 0;  // cudnnConvolutionForward / BackwardData / BackwardFilter calls
  int64_t copies = 0;        // cudaMemcpyAsync / cudaMemsetAsync calls
  // cudaGraphLaunch calls (fusion.cuda_graph): one replays a whole captured step, whose kernels
  // the host does not issue again, so they are not in the counts above.
  int64_t graphs = 0;
  int64_t total() const { return kernels + gemms + convolutions + copies + graphs; }
};

// Field by field `after - before`, for the launches between two snapshots.
LaunchCounts operator-(const LaunchCounts& after, const LaunchCounts& before);
LaunchCounts& operator+=(LaunchCounts& sum, const LaunchCounts& more);

// The counts since the process started.
LaunchCounts launch_counts();
// Counts one launch of `kind`. Cheap enough for every launch: one relaxed atomic increment.
void count_launch(LaunchKind kind);

}  // namespace ft

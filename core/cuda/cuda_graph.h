// CudaGraph: one captured CUDA graph, replayed with cudaGraphLaunch. The trainer captures a whole
// training step with it (fusion.cuda_graph): every kernel, copy, cuBLASLt and cuDNN call and NCCL
// bucket launch enqueued on the compute stream, and on the streams it forks to through events
// (the communication stream), becomes one graph, so a replay costs one launch instead of one per
// kernel. A replay reuses the captured kernel arguments and addresses: whatever changes between
// steps must live in device memory that the host rewrites before each launch.
// Capture runs in relaxed mode (the caching allocator and cuDNN's plan cache may still call the
// runtime during capture); the device caching allocator holds back every block released during
// capture for the graph's lifetime (CachingAllocator::begin_hold), because every replay still
// writes it.
// Thread safety: the training thread owns it.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/allocator.h"

namespace ft {

// What a captured graph holds, by node type (cudaGraphNodeType), for `bench` and the logs.
struct CudaGraphNodes {
  int64_t kernels = 0, copies = 0, memsets = 0, other = 0;
  int64_t total() const { return kernels + copies + memsets + other; }
};

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();  // waits for a replay in flight, then frees the graph and its held blocks
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Starts capturing `stream`. REQUIRES: no capture in progress and nothing captured yet.
  void begin_capture(cudaStream_t stream);
  // Ends the capture and instantiates the graph. Throws ft::Error naming the runtime's error when
  // the capture was invalidated (a synchronising call on the stream, a host copy, ...).
  void end_capture();
  // Abandons a capture after an exception inside it, so the stream is usable again. Never throws.
  void abort_capture() noexcept;
  // Enqueues one replay on `stream`. REQUIRES: captured().
  void launch(cudaStream_t stream);

  bool captured() const { return exec_ != nullptr; }
  const CudaGraphNodes& nodes() const { return nodes_; }

 private:
  void keep_held(const CachingAllocator::HeldBlocks& blocks);

  cudaStream_t stream_ = nullptr;
  bool capturing_ = false;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  CudaGraphNodes nodes_;
  CachingAllocator::HeldBlocks held_blocks_;
};

}  // namespace ft

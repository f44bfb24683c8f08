#include "core/cuda/cuda_graph.h"

#include <vector>

#include "core/capture_guard.h"
#include "core/check.h"
#include "core/cuda/cuda_check.h"
#include "core/launch_counter.h"

namespace ft {
namespace {

CudaGraphNodes count_nodes(cudaGraph_t graph) {
  size_t count = 0;
  FT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  if (count > 0) FT_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  CudaGraphNodes counts;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    FT_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeKernel)
      ++counts.kernels;
    else if (type == cudaGraphNodeTypeMemcpy)
      ++counts.copies;
    else if (type == cudaGraphNodeTypeMemset)
      ++counts.memsets;
    else if (type != cudaGraphNodeTypeEmpty)
      ++counts.other;  // event records and waits, NCCL's host nodes, child graphs
  }
  return counts;
}

}  // namespace

CudaGraph::~CudaGraph() {
  abort_capture();
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  if (graph_ != nullptr) cudaGraphDestroy(graph_);
  CachingAllocator::device().return_held(held_blocks_);
}

void CudaGraph::begin_capture(cudaStream_t stream) {
  FT_CHECK(!capturing_ && exec_ == nullptr, "CudaGraph: captured twice");
  stream_ = stream;
  CachingAllocator::device().begin_hold();
  const cudaError_t status = cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed);
  if (status != cudaSuccess) keep_held(CachingAllocator::device().end_hold());
  FT_CUDA_CHECK(status);
  capturing_ = true;
  set_capturing(true);  // host-synchronising paths now throw (core/capture_guard.h)
}

void CudaGraph::end_capture() {
  FT_CHECK(capturing_, "CudaGraph::end_capture without begin_capture");
  capturing_ = false;
  set_capturing(false);
  const cudaError_t status = cudaStreamEndCapture(stream_, &graph_);
  keep_held(CachingAllocator::device().end_hold());
  // The failure is reported below; cleared here so the next FT_CUDA_CHECK_LAUNCH does not report
  // it again against an unrelated kernel.
  if (status != cudaSuccess) cudaGetLastError();
  FT_REQUIRE(status == cudaSuccess, "fusion.cuda_graph: capturing the training step failed (",
             cudaGetErrorName(status), ": ", cudaGetErrorString(status),
             "); some op synchronised or copied to the host inside the step; set "
             "fusion.cuda_graph: false");
  FT_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  nodes_ = count_nodes(graph_);
}

void CudaGraph::abort_capture() noexcept {
  if (!capturing_) return;
  capturing_ = false;
  set_capturing(false);
  cudaGraph_t partial = nullptr;
  cudaStreamEndCapture(stream_, &partial);
  if (partial != nullptr) cudaGraphDestroy(partial);
  cudaGetLastError();  // the invalidated capture's sticky error
  keep_held(CachingAllocator::device().end_hold());
}

void CudaGraph::keep_held(const CachingAllocator::HeldBlocks& blocks) {
  // Appended, not assigned: a capture tried again after a failure must not drop the first one's.
  held_blocks_.insert(held_blocks_.end(), blocks.begin(), blocks.end());
}

void CudaGraph::launch(cudaStream_t stream) {
  FT_CHECK(exec_ != nullptr, "CudaGraph::launch before a capture");
  FT_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
  count_launch(LaunchKind::kGraph);
}

}  // namespace ft

// CudaContext: the process's CUDA state for training, made once on first use: the selected
// device, a compute stream (every op kernel, fill and copy), the cuBLASLt GEMM and, on first use,
// the cuDNN handle. NCCL's bucket reductions run on the communicator's own stream
// (comm/nccl/nccl_communicator.cpp), ordered against compute by events.
// Ops reach it through cuda_context(); nothing else creates compute streams or handles.
// Thread safety: the training thread owns it.
#pragma once
#include <cuda_runtime_api.h>

#include <memory>

#include "core/cuda/cublaslt_gemm.h"
#include "core/cuda/cudnn_handle.h"

namespace ft {

class CudaContext {
 public:
  // Selects `device_index` (local rank modulo device count, see select_cuda_device) and creates
  // the compute stream and the cuBLASLt handle. Throws ft::Error when no device can be used.
  explicit CudaContext(int device_index);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device_index() const { return device_index_; }
  cudaStream_t compute_stream() const { return compute_stream_; }
  CublasLtGemm& gemm() { return *gemm_; }
  // Created on first use (the first convolution), so a GPT run never initialises cuDNN: its
  // engine libraries load only when a handle is made, and a GPU image with a broken or missing
  // cuDNN piece still trains the GPT.
  CudnnHandle& cudnn();

 private:
  int device_index_;
  cudaStream_t compute_stream_ = nullptr;
  std::unique_ptr<CublasLtGemm> gemm_;
  std::unique_ptr<CudnnHandle> cudnn_;
};

// Picks the device the process trains on: `local_rank` modulo the visible devices, so that
// several ranks of one machine spread over its GPUs and share one when there is only one (the MPI
// backend allows that; NCCL refuses it). Call before the first cuda_context(). Default 0.
void select_cuda_device(int local_rank);

// The process's context, created on first call on the selected device.
CudaContext& cuda_context();

}  // namespace ft

// cuDNN handle ownership.
#include "core/cuda/cudnn_handle.h"

#include "core/cuda/cuda_check.h"

namespace ft {

CudnnHandle::CudnnHandle() {
  FT_CUDNN_CHECK(cudnnCreate(&handle_));
}

CudnnHandle::~CudnnHandle() {
  if (handle_ != nullptr) cudnnDestroy(handle_);  // errors ignored: destructors never throw
}

void CudnnHandle::set_stream(cudaStream_t stream) {
  FT_CUDNN_CHECK(cudnnSetStream(handle_, stream));
}

size_t cudnn_version() {
  return cudnnGetVersion();
}

}  // namespace ft

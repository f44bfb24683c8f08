#include "core/cuda/cuda_context.h"

#include "core/cuda/cuda_check.h"

namespace ft {
namespace {

int selected_local_rank = 0;

}  // namespace

CudaContext::CudaContext(int device_index) : device_index_(device_index) {
  FT_CHECK(cuda_device_available(), "no usable CUDA device: ", cuda_unavailable_reason());
  FT_CUDA_CHECK(cudaSetDevice(device_index));
  FT_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_stream_, cudaStreamNonBlocking));
  gemm_ = std::make_unique<CublasLtGemm>();
}

CudnnHandle& CudaContext::cudnn() {
  if (!cudnn_) {
    auto handle = std::make_unique<CudnnHandle>();
    handle->set_stream(compute_stream_);
    cudnn_ = std::move(handle);
  }
  return *cudnn_;
}

CudaContext::~CudaContext() {
  gemm_.reset();
  cudnn_.reset();
  if (compute_stream_ != nullptr) cudaStreamDestroy(compute_stream_);
}

void select_cuda_device(int local_rank) {
  selected_local_rank = local_rank < 0 ? 0 : local_rank;
}

CudaContext& cuda_context() {
  // Never destroyed: static destruction order against the CUDA runtime's own teardown is
  // unspecified, and freeing handles after the runtime unloads crashes at exit.
  static CudaContext* context = [] {
    int device_count = 0;
    FT_CUDA_CHECK(cudaGetDeviceCount(&device_count));
    return new CudaContext(selected_local_rank % (device_count > 0 ? device_count : 1));
  }();
  return *context;
}

}  // namespace ft

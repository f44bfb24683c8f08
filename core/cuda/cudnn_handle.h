// CudnnHandle: owns one cuDNN handle (created on the current device) for the convolution kernels
// of the ResNet GPU path; cudnn_version() reports the library actually loaded at run time.
// Thread safety: a handle is used by one thread at a time (cuDNN's own rule); cudnn_version() is
// safe from any thread.
#pragma once
#include <cudnn.h>

#include <cstddef>

namespace ft {

class CudnnHandle {
 public:
  // Throws ft::Error when cuDNN cannot initialise (no device, driver too old).
  CudnnHandle();
  ~CudnnHandle();  // never throws
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;

  cudnnHandle_t get() const { return handle_; }
  // Later calls through this handle are enqueued on `stream`.
  void set_stream(cudaStream_t stream);

 private:
  cudnnHandle_t handle_ = nullptr;
};

// cudnnGetVersion() of the loaded library, e.g. 91300 for 9.13.0. Needs no device.
size_t cudnn_version();

}  // namespace ft

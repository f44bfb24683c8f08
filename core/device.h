// Where tensors live and how an op picks the kernel of their device. Each op keeps its CPU kernel
// and its CUDA kernel side by side (kernels/gelu.cpp and gelu.cu); the op's forward and backward
// start with FT_RUN_ON_CUDA(ws, launcher(...)), which runs the CUDA launcher and returns when the
// workspace is on the GPU. Builds without CUDA compile the macro away, so CPU-only builds need no
// CUDA symbol, and model code never branches on the device.
// This header needs no CUDA header: CudaStream is the runtime's cudaStream_t by another name.
// Thread safety: stateless.
#pragma once
#include <string>

#include "core/tensor.h"

struct CUstream_st;

namespace ft {

using CudaStream = CUstream_st*;  // == cudaStream_t

const char* device_name(Device device);

// Empty when a CUDA device can be used; otherwise a sentence a user can act on, naming `setting`
// (e.g. "train.device: cuda"): the build has no CUDA path, or the runtime found no device. The
// caller appends what to do instead.
std::string cuda_unusable_reason(const std::string& setting);

}  // namespace ft

#if defined(FT_HAVE_CUDA)
#define FT_RUN_ON_CUDA(ws, call)              \
  do {                                        \
    if ((ws).device == ::ft::Device::kCuda) { \
      call;                                   \
      return;                                 \
    }                                         \
  } while (0)
#else
#define FT_RUN_ON_CUDA(ws, call) static_cast<void>(0)
#endif

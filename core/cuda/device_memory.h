// Raw device memory for Tensor and the caching allocator: allocation, fills and copies on the
// compute stream of core/cuda/cuda_context.h. Only CUDA builds compile it; core/tensor.cpp calls
// it for tensors whose device is kCuda.
// Thread safety: the functions enqueue on the compute stream, which belongs to the training thread.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace ft {

// cudaMalloc / cudaFree. A failed allocation throws ft::Error saying how much was asked for and
// how much the device has free.
void* cuda_malloc(size_t bytes);
void cuda_free(void* ptr);  // never throws

// data[i] = value for i < count, on `stream` (cudaMemsetAsync for 0, a kernel otherwise).
void cuda_fill(float* data, int64_t count, float value, CudaStream stream);
// data[i] *= scale; destination[i] = source[i] * scale (for i < count), on `stream`.
void cuda_scale(float* data, int64_t count, float scale, CudaStream stream);
void cuda_scaled_copy(float* destination, const float* source, int64_t count, float scale,
                      CudaStream stream);
// cudaHostAlloc / cudaFreeHost: page-locked host memory, which copies to and from the device at
// full bus speed and without an extra staging copy inside the driver.
void* cuda_pinned_malloc(size_t bytes);
void cuda_pinned_free(void* ptr);  // never throws
// Copies `bytes` between any two of host and device memory (unified addressing tells which), on
// `stream`; returns once the copy is done when either side is host memory, so the caller may
// reuse or read a host buffer at once.
void cuda_copy(void* destination, const void* source, size_t bytes, CudaStream stream);

}  // namespace ft

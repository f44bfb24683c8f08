// Device allocation, fills and copies behind Tensor's cuda storage.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <string>

#include "core/allocator.h"
#include "core/capture_guard.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/launch.h"
#include "core/launch_counter.h"

namespace ft {

namespace {

constexpr const char* kLowerSizesHint =
    "reduce train.batch_size, model sizes or bench/bandwidth sizes";

double gib(size_t bytes) {
  return static_cast<double>(bytes) / (uint64_t{1} << 30);
}

}  // namespace

void* cuda_malloc(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky error so the process can go on to report it
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw OutOfMemory(detail::concat("out of GPU memory allocating ", std::fixed,
                                     std::setprecision(1), gib(bytes), " GiB (", bytes, " bytes; ",
                                     gib(free_bytes), " of ", gib(total_bytes), " GiB free); ",
                                     kLowerSizesHint));
  }
  FT_CUDA_CHECK(status);
  return ptr;
}

void cuda_free(void* ptr) {
  if (ptr != nullptr) cudaFree(ptr);
}

__global__ void fill_kernel(float* data, int64_t count, float value) {
  FT_GRID_STRIDE_LOOP(i, count) {
    data[i] = value;
  }
}

void cuda_fill(float* data, int64_t count, float value, CudaStream stream) {
  if (count <= 0) return;
  if (value == 0.0f && !std::signbit(value)) {
    FT_CUDA_CHECK(cudaMemsetAsync(data, 0, static_cast<size_t>(count) * sizeof(float), stream));
    count_launch(LaunchKind::kCopy);
    return;
  }
  fill_kernel<<<cuda_grid_stride_blocks(count), kCudaThreadsPerBlock, 0, stream>>>(data, count,
                                                                                   value);
  FT_CUDA_CHECK_LAUNCH();
}

__global__ void scale_kernel(float* data, int64_t count, float scale) {
  FT_GRID_STRIDE_LOOP(i, count) {
    data[i] *= scale;
  }
}

__global__ void scaled_copy_kernel(float* destination, const float* source, int64_t count,
                                   float scale) {
  FT_GRID_STRIDE_LOOP(i, count) {
    destination[i] = source[i] * scale;
  }
}

void cuda_scale(float* data, int64_t count, float scale, CudaStream stream) {
  if (count <= 0 || scale == 1.0f) return;
  scale_kernel<<<cuda_grid_stride_blocks(count), kCudaThreadsPerBlock, 0, stream>>>(data, count,
                                                                                    scale);
  FT_CUDA_CHECK_LAUNCH();
}

void cuda_scaled_copy(float* destination, const float* source, int64_t count, float scale,
                      CudaStream stream) {
  if (count <= 0) return;
  scaled_copy_kernel<<<cuda_grid_stride_blocks(count), kCudaThreadsPerBlock, 0, stream>>>(
      destination, source, count, scale);
  FT_CUDA_CHECK_LAUNCH();
}

void* cuda_pinned_malloc(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t status = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // as in cuda_malloc: clear the error, report the size and what to lower
    throw OutOfMemory(detail::concat("out of pinned host memory allocating ", std::fixed,
                                     std::setprecision(1), gib(bytes), " GiB (", bytes, " bytes); ",
                                     kLowerSizesHint));
  }
  FT_CUDA_CHECK(status);
  return ptr;
}

void cuda_pinned_free(void* ptr) {
  if (ptr != nullptr) cudaFreeHost(ptr);
}

void cuda_copy(void* destination, const void* source, size_t bytes, CudaStream stream) {
  if (bytes == 0) return;
  FT_CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, stream));
  count_launch(LaunchKind::kCopy);
  cudaPointerAttributes destination_attributes{}, source_attributes{};
  FT_CUDA_CHECK(cudaPointerGetAttributes(&destination_attributes, destination));
  FT_CUDA_CHECK(cudaPointerGetAttributes(&source_attributes, source));
  const bool host_side = destination_attributes.type != cudaMemoryTypeDevice ||
                         source_attributes.type != cudaMemoryTypeDevice;
  if (host_side) {
    require_not_capturing("a copy between host and device memory");
    FT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
}

}  // namespace ft

namespace ft {

// Blocks are reused in compute-stream order: a block freed by one op and handed to the next is
// only touched by kernels on the same stream, so no event is needed between them.
CachingAllocator& CachingAllocator::device() {
  static CachingAllocator* allocator = new CachingAllocator(cuda_malloc, cuda_free);
  return *allocator;
}

CachingAllocator& CachingAllocator::pinned() {
  static CachingAllocator* allocator = new CachingAllocator(cuda_pinned_malloc, cuda_pinned_free);
  return *allocator;
}

}  // namespace ft

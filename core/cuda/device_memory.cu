// Device allocation, fills and copies behind Tensor's cuda storage.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "core/allocator.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/device_memory.h"

namespace ft {

void* cuda_malloc(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky error so the process can go on to report it
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw Error("out of GPU memory allocating " + std::to_string(bytes >> 20) + " MiB (" +
                std::to_string(free_bytes >> 20) + " of " + std::to_string(total_bytes >> 20) +
                " MiB free); lower train.batch_size");
  }
  FT_CUDA_CHECK(status);
  return ptr;
}

void cuda_free(void* ptr) {
  if (ptr != nullptr) cudaFree(ptr);
}

__global__ void fill_kernel(float* data, int64_t count, float value) {
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (index < count) data[index] = value;
}

void cuda_fill(float* data, int64_t count, float value, CudaStream stream) {
  if (count <= 0) return;
  if (value == 0.0f && !std::signbit(value)) {
    FT_CUDA_CHECK(cudaMemsetAsync(data, 0, static_cast<size_t>(count) * sizeof(float), stream));
    return;
  }
  const int threads = 256;
  const int64_t blocks = (count + threads - 1) / threads;
  fill_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(data, count, value);
  FT_CUDA_CHECK_LAUNCH();
}

void cuda_copy(void* destination, const void* source, size_t bytes, CudaStream stream) {
  if (bytes == 0) return;
  FT_CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, stream));
  cudaPointerAttributes destination_attributes{}, source_attributes{};
  FT_CUDA_CHECK(cudaPointerGetAttributes(&destination_attributes, destination));
  FT_CUDA_CHECK(cudaPointerGetAttributes(&source_attributes, source));
  const bool host_side = destination_attributes.type != cudaMemoryTypeDevice ||
                         source_attributes.type != cudaMemoryTypeDevice;
  if (host_side) FT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace ft

namespace ft {

// Blocks are reused in compute-stream order: a block freed by one op and handed to the next is
// only touched by kernels on the same stream, so no event is needed between them.
CachingAllocator& CachingAllocator::device() {
  static CachingAllocator* allocator = new CachingAllocator(cuda_malloc, cuda_free);
  return *allocator;
}

}  // namespace ft

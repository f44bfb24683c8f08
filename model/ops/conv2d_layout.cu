// The layout moves of model/ops/conv2d_layout.h: one thread per output element, so writes are
// coalesced and reads strided. They move weights (K*C*R*S elements, tens of thousands) and the
// stem's images, small next to the convolutions they serve.
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "model/ops/conv2d_layout.h"

namespace ft {
namespace {

FT_HD float widened(float value) {
  return value;
}
FT_HD float widened(bf16_bits value) {
  return bf16_to_float(value);
}

template <typename T>
__global__ void to_channels_last_kernel(T* out, const T* in, int64_t channels, int64_t inner,
                                        int64_t count) {
  FT_GRID_STRIDE_LOOP(j, count) {
    out[j] = in[channels_last_source(j, channels, inner)];
  }
}

template <typename T, bool kAccumulate>
__global__ void from_channels_last_kernel(float* out, const T* in, int64_t channels, int64_t inner,
                                          int64_t count) {
  FT_GRID_STRIDE_LOOP(j, count) {
    const float value = widened(in[channels_first_source(j, channels, inner)]);
    out[j] = kAccumulate ? out[j] + value : value;
  }
}

}  // namespace

template <typename T>
void cuda_to_channels_last(T* out, const T* in, int64_t outer, int64_t channels, int64_t inner,
                           CudaStream stream) {
  const int64_t count = outer * channels * inner;
  if (count <= 0) return;
  to_channels_last_kernel<T><<<cuda_grid_stride_blocks(count), kCudaThreadsPerBlock, 0, stream>>>(
      out, in, channels, inner, count);
  FT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void cuda_from_channels_last(float* out, const T* in, int64_t outer, int64_t channels,
                             int64_t inner, bool accumulate, CudaStream stream) {
  const int64_t count = outer * channels * inner;
  if (count <= 0) return;
  const unsigned int blocks = cuda_grid_stride_blocks(count);
  if (accumulate) {
    from_channels_last_kernel<T, true>
        <<<blocks, kCudaThreadsPerBlock, 0, stream>>>(out, in, channels, inner, count);
    FT_CUDA_CHECK_LAUNCH();
    return;
  }
  from_channels_last_kernel<T, false>
      <<<blocks, kCudaThreadsPerBlock, 0, stream>>>(out, in, channels, inner, count);
  FT_CUDA_CHECK_LAUNCH();
}

template void cuda_to_channels_last<float>(float*, const float*, int64_t, int64_t, int64_t,
                                           CudaStream);
template void cuda_to_channels_last<bf16_bits>(bf16_bits*, const bf16_bits*, int64_t, int64_t,
                                               int64_t, CudaStream);
template void cuda_from_channels_last<float>(float*, const float*, int64_t, int64_t, int64_t, bool,
                                             CudaStream);
template void cuda_from_channels_last<bf16_bits>(float*, const bf16_bits*, int64_t, int64_t,
                                                 int64_t, bool, CudaStream);

}  // namespace ft

// Internal to Conv2dOp's CUDA path (conv2d.cu, conv2d_bf16.cu; CUDA builds only): moving
// operands into cuDNN's channels-last layout and results back out of it.
// Why: cuDNN 9.19 on an H200 offered no backward algorithm (every one NOT_SUPPORTED) for an NHWC
// input with a KCRS (OIHW) filter, or for an NCHW input with an NHWC output; all channels last
// (x NHWC, filter KRSC, y NHWC) is the layout every pass has kernels for. Our weights stay OIHW
// (the CPU kernels', the checkpoints' and PyTorch's order) and the stem may read NCHW images, so
// those are transposed into scratch for cuDNN, and dW / dx transposed back.
// Both directions view a tensor as [outer][channels][inner]: OIHW weights are outer = K,
// channels = C, inner = R*S; NCHW images outer = N, channels = C, inner = H*W.
#pragma once
#include <cstdint>

#include "core/device.h"
#include "core/math/bf16_math.h"

namespace ft {

// The index math both directions share with the CPU tests: for element j of the output (its
// flat index), the flat index of the input element it comes from.
// to channels last: out [outer][inner][channels] from in [outer][channels][inner].
FT_HD int64_t channels_last_source(int64_t j, int64_t channels, int64_t inner) {
  const int64_t per_outer = channels * inner;
  const int64_t o = j / per_outer, i = (j % per_outer) / channels, c = j % channels;
  return o * per_outer + c * inner + i;
}
// from channels last: out [outer][channels][inner] from in [outer][inner][channels].
FT_HD int64_t channels_first_source(int64_t j, int64_t channels, int64_t inner) {
  const int64_t per_outer = channels * inner;
  const int64_t o = j / per_outer, c = (j % per_outer) / inner, i = j % inner;
  return o * per_outer + i * channels + c;
}

// out[o][i][c] = in[o][c][i]. T: float or bf16_bits.
template <typename T>
void cuda_to_channels_last(T* out, const T* in, int64_t outer, int64_t channels, int64_t inner,
                           CudaStream stream);

// out[o][c][i] = in[o][i][c] widened to fp32, or += it when `accumulate`. T: float or bf16_bits.
// channels = 1 is a plain copy (widening) of outer * inner elements.
template <typename T>
void cuda_from_channels_last(float* out, const T* in, int64_t outer, int64_t channels,
                             int64_t inner, bool accumulate, CudaStream stream);

}  // namespace ft

// Conv2dOp's bf16 passes on cuDNN (train.precision: bf16 on cuda), the CUDA twin of the CPU's
// bf16 path (conv2d.cpp): x is a bf16 value, the weight is the parameter's bf16 copy, dy is
// rounded to bf16 once per backward (bf16_gradient_copy_cuda, CastOp's rounding), and y, dx and
// dW are fp32 with every product accumulated in fp32.
// cuDNN's legacy API has no bf16-in / fp32-out configuration: its PSEUDO_BFLOAT16_CONFIG has x,
// w and y (dx, dw) all bf16 with an fp32 compute type. So each pass writes (beta = 0) into a bf16
// scratch buffer, and a widening kernel (core/cuda/bf16_kernels.h) overwrites or adds it into the
// fp32 destination, which keeps Op::backward's `=` for a fresh dx and `+=` otherwise (and always
// for dW). The GPU therefore rounds each convolution output (y, dx, dW) to bf16 once before
// widening, as PyTorch autocast's bf16 convolutions do, while the CPU keeps them fp32: GPU-vs-CPU
// tests need a bf16-sized tolerance (about 2^-8 relative per element), not fp32's.
// Compiled, not yet run on a GPU.
#include "core/cuda/bf16_kernels.h"
#include "core/tensor.h"
#include "model/ops/conv2d.h"
#include "model/ops/conv2d_cudnn.h"
#include "model/ops/linear.h"

namespace ft {
namespace {

CudnnConvDescriptors& bf16_descriptors(CudnnConv& conv) {
  if (!conv.bf16) conv.bf16 = std::make_unique<CudnnConvDescriptors>(conv.shape, true);
  return *conv.bf16;
}

// A bf16 result buffer of `count` elements from the caching allocator; freed blocks go back to
// it, ordered on the one compute stream (as the cuDNN workspaces of conv2d.cu).
Tensor bf16_scratch(int64_t count) {
  return Tensor::empty({count}, Device::kCuda, DType::kBF16);
}

// out = widened, or out += widened.
void widen_into(float* out, const bf16_bits* in, int64_t count, bool accumulate,
                CudaStream stream) {
  if (accumulate) return cuda_add_widened_bf16(out, in, count, stream);
  cuda_widen_bf16(out, in, count, stream);
}

}  // namespace

void conv2d_forward_bf16_cuda(float* y, const bf16_bits* x, const bf16_bits* weight,
                              CudnnConv& conv, CudaStream stream) {
  const CudnnConvShape& s = conv.shape;
  const int64_t count = static_cast<int64_t>(s.batch) * s.out_height * s.out_width * s.out_channels;
  Tensor rounded = bf16_scratch(count);
  cudnn_conv_forward(bf16_descriptors(conv), s, cudnn_handle_on(stream), x, weight,
                     rounded.bf16_data(), /*accumulate=*/false);
  widen_into(y, rounded.bf16_data(), count, /*accumulate=*/false, stream);
}

void conv2d_backward_bf16_cuda(float* dx, float* dweight, const float* dy, const bf16_bits* x,
                               const bf16_bits* weight, bool dx_fresh, CudnnConv& conv,
                               CudaStream stream) {
  const CudnnConvShape& s = conv.shape;
  CudnnConvDescriptors& d = bf16_descriptors(conv);
  const cudnnHandle_t handle = cudnn_handle_on(stream);
  const int64_t pixels = static_cast<int64_t>(s.batch) * s.out_height * s.out_width;
  // Every reader of the copy is enqueued below, before the next bf16_gradient_copy_cuda call.
  const bf16_bits* dy_bf16 =
      bf16_gradient_copy_cuda(dy, pixels, s.out_channels, s.out_channels, stream);
  const int64_t weight_count =
      static_cast<int64_t>(s.out_channels) * s.in_channels * s.kernel * s.kernel;
  Tensor dweight_bf16 = bf16_scratch(weight_count);
  cudnn_conv_backward_filter(d, s, handle, x, dy_bf16, dweight_bf16.bf16_data(),
                             /*accumulate=*/false);
  widen_into(dweight, dweight_bf16.bf16_data(), weight_count, /*accumulate=*/true, stream);
  if (dx == nullptr) return;
  const int64_t input_count = static_cast<int64_t>(s.batch) * s.height * s.width * s.in_channels;
  Tensor dx_bf16 = bf16_scratch(input_count);
  cudnn_conv_backward_data(d, s, handle, weight, dy_bf16, dx_bf16.bf16_data(),
                           /*accumulate=*/false);
  widen_into(dx, dx_bf16.bf16_data(), input_count, !dx_fresh, stream);
}

}  // namespace ft

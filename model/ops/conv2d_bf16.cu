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
// Operands and results cross into cuDNN's channels-last layout as in conv2d.cu.
#include "core/cuda/bf16_kernels.h"
#include "core/tensor.h"
#include "model/ops/conv2d.h"
#include "model/ops/conv2d_cudnn.h"
#include "model/ops/conv2d_layout.h"
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

}  // namespace

void conv2d_forward_bf16_cuda(float* y, const bf16_bits* x, const bf16_bits* weight,
                              CudnnConv& conv, CudaStream stream) {
  const CudnnConvShape& s = conv.shape;
  const int64_t count = static_cast<int64_t>(s.batch) * s.out_height * s.out_width * s.out_channels;
  Tensor rounded = bf16_scratch(count), x_copy, weight_copy;
  cudnn_conv_forward(bf16_descriptors(conv), s, cudnn_handle_on(stream),
                     cudnn_input(s, true, x, x_copy, stream),
                     cudnn_weight(s, true, weight, weight_copy, stream), rounded.bf16_data(),
                     /*accumulate=*/false);
  cuda_widen_bf16(y, rounded.bf16_data(), count, stream);
}

// dW and dx come back in cuDNN's layout (KRSC, NHWC); widening them moves them into ours.
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
  const LayoutMove dweight_move = weight_from_krsc(s);
  Tensor dweight_bf16 = bf16_scratch(dweight_move.count()), x_copy;
  cudnn_conv_backward_filter(d, s, handle, cudnn_input(s, true, x, x_copy, stream), dy_bf16,
                             dweight_bf16.bf16_data(), /*accumulate=*/false);
  cuda_from_channels_last(dweight, dweight_bf16.bf16_data(), dweight_move.outer,
                          dweight_move.channels, dweight_move.inner, /*accumulate=*/true, stream);
  if (dx == nullptr) return;
  const LayoutMove dx_move = input_from_nhwc(s);
  Tensor dx_bf16 = bf16_scratch(dx_move.count()), weight_copy;
  cudnn_conv_backward_data(d, s, handle, cudnn_weight(s, true, weight, weight_copy, stream),
                           dy_bf16, dx_bf16.bf16_data(), /*accumulate=*/false);
  cuda_from_channels_last(dx, dx_bf16.bf16_data(), dx_move.outer, dx_move.channels, dx_move.inner,
                          !dx_fresh, stream);
}

}  // namespace ft

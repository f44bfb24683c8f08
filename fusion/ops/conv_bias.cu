// ConvBiasOp on CUDA: the fold runs on the host (fold_batchnorm over a host copy of the
// parameters, in double as on the CPU) and W', b' are uploaded once per ParamStore::version(),
// which moves only when parameters may have changed, so an eval graph between optimizer steps
// reuses them. Then cuDNN's convolution writes conv(x, W') into y and one elementwise kernel
// applies the epilogue in place: y = act(y + b' [+ residual]). Winograd (spec.winograd) is a CPU
// algorithm choice; on cuda every shape runs on cuDNN.
// A bf16 x (train.precision: bf16) multiplies W' rounded to bf16, as the CPU does, uploaded as a
// bf16 tensor; cuDNN's bf16 convolution (model/ops/conv2d_bf16.cu) rounds conv(x, W') to bf16
// once before widening it into y, where the CPU keeps it fp32. Compiled, not yet run on a GPU.
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "core/math/bf16_math.h"
#include "fusion/ops/conv_bias.h"
#include "model/ops/relu.h"

namespace ft {
namespace {

template <bool kResidual, bool kRelu>
__global__ void conv_bias_epilogue_kernel(float* y, const float* bias, const float* residual,
                                          int64_t numel, int channels) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    float z = y[i] + bias[i % channels];
    if (kResidual) z += residual[i];
    y[i] = kRelu ? relu_value(z) : z;
  }
}

}  // namespace

void conv_bias_epilogue_cuda(float* y, const float* bias, const float* residual, int64_t rows,
                             int channels, bool relu, CudaStream stream) {
  const int64_t numel = rows * channels;
  if (numel <= 0) return;
  // One launch site for the four instantiations, so its check counts exactly one launch.
  const bool with_residual = residual != nullptr;
  const auto kernel =
      with_residual
          ? (relu ? conv_bias_epilogue_kernel<true, true> : conv_bias_epilogue_kernel<true, false>)
          : (relu ? conv_bias_epilogue_kernel<false, true>
                  : conv_bias_epilogue_kernel<false, false>);
  kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(y, bias, residual,
                                                                              numel, channels);
  FT_CUDA_CHECK_LAUNCH();
}

void ConvBiasOp::forward_cuda(Workspace& ws, ParamStore& params) {
  if (!cudnn_)
    cudnn_ = make_cudnn_conv(cudnn_conv_shape(spec_.batch, spec_.in_channels, spec_.out_channels,
                                              spec_.height, spec_.width, spec_.kernel, spec_.stride,
                                              spec_.padding, spec_.input_layout));
  const Tensor& x = ws.values[inputs[0]];
  const DType operands = x.dtype();
  if (!cuda_ready_ || cuda_version_ != params.version() || cuda_weight_.dtype() != operands) {
    std::vector<float> weight, bias;
    folded(params, &weight, &bias);
    if (!cuda_weight_.defined() || cuda_weight_.numel() == 0 || cuda_weight_.dtype() != operands) {
      cuda_weight_ = Tensor::empty(weight_shape(), Device::kCuda, operands);
      cuda_bias_ = Tensor::empty({spec_.out_channels}, Device::kCuda);
    }
    if (operands == DType::kBF16) {
      std::vector<bf16_bits> rounded(weight.size());
      for (size_t i = 0; i < weight.size(); ++i) rounded[i] = float_to_bf16(weight[i]);
      cuda_weight_.copy_from(Tensor::wrap(rounded.data(), weight_shape()));
    } else {
      cuda_weight_.copy_from(Tensor::wrap(weight.data(), weight_shape()));
    }
    cuda_bias_.copy_from(Tensor::wrap(bias.data(), {spec_.out_channels}));
    cuda_version_ = params.version();
    cuda_ready_ = true;
  }
  float* y = ws.values[outputs[0]].data();
  if (operands == DType::kBF16)
    conv2d_forward_bf16_cuda(y, x.bf16_data(), cuda_weight_.bf16_data(), *cudnn_, ws.stream);
  else
    conv2d_forward_cuda(y, x.data(), cuda_weight_.data(), *cudnn_, ws.stream);
  const float* residual = spec_.residual ? ws.values[inputs[1]].data() : nullptr;
  conv_bias_epilogue_cuda(y, cuda_bias_.data(), residual,
                          static_cast<int64_t>(spec_.batch) * out_height_ * out_width_,
                          spec_.out_channels, spec_.relu, ws.stream);
}

}  // namespace ft

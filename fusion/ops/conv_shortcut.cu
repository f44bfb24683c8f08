// ConvShortcutOp on CUDA: the packing of [w3 ; w1 at the centre tap], the split of the combined
// output rows into y3 and y1 (and the merge of their gradients back) and the unpacking of dW are
// elementwise kernels; the combined 3x3 convolution is the private Conv2dOp on cuDNN, in fp32 or
// (a bf16 x) in bf16 (compiled, not yet run on a GPU).
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "fusion/ops/conv_shortcut.h"

namespace ft {
namespace {

constexpr int kTaps = 9;
constexpr int kCentreTap = 4;  // (1, 1) of a 3x3 kernel

// packed[i] = w3[i] for the first Cout*Cin*9 entries; then w1 at the centre tap, 0 elsewhere.
__global__ void pack_weights_kernel(float* packed, const float* w3, const float* w1,
                                    int64_t out_by_in) {
  const int64_t branch = out_by_in * kTaps;
  FT_GRID_STRIDE_LOOP(i, 2 * branch) {
    if (i < branch) {
      packed[i] = w3[i];
    } else {
      const int64_t j = i - branch;
      packed[i] = j % kTaps == kCentreTap ? w1[j / kTaps] : 0.0f;
    }
  }
}

// kSplit: first/second [rows, width] from combined [rows, 2 width]; else the reverse.
template <bool kSplit>
__global__ void split_or_merge_kernel(float* first, float* second, float* combined, int64_t rows,
                                      int width) {
  FT_GRID_STRIDE_LOOP(i, rows * width) {
    const int64_t r = i / width;
    const int64_t j = i % width;
    float* in_first = combined + 2 * r * width + j;
    float* in_second = in_first + width;
    if (kSplit) {
      first[i] = *in_first;
      second[i] = *in_second;
    } else {
      *in_first = first[i];
      *in_second = second[i];
    }
  }
}

__global__ void unpack_grads_kernel(float* dw3, float* dw1, const float* packed_grad,
                                    int64_t out_by_in) {
  const int64_t branch = out_by_in * kTaps;
  FT_GRID_STRIDE_LOOP(i, branch) {
    dw3[i] += packed_grad[i];
    if (i < out_by_in) dw1[i] += packed_grad[branch + i * kTaps + kCentreTap];
  }
}

}  // namespace

void conv_shortcut_pack_weights_cuda(float* packed, const float* w3, const float* w1,
                                     int64_t out_by_in, CudaStream stream) {
  if (out_by_in <= 0) return;
  pack_weights_kernel<<<cuda_grid_stride_blocks(2 * out_by_in * kTaps), kCudaThreadsPerBlock, 0,
                        stream>>>(packed, w3, w1, out_by_in);
  FT_CUDA_CHECK_LAUNCH();
}

void conv_shortcut_split_rows_cuda(float* first, float* second, const float* combined, int64_t rows,
                                   int width, CudaStream stream) {
  if (rows <= 0 || width <= 0) return;
  split_or_merge_kernel<true>
      <<<cuda_grid_stride_blocks(rows * width), kCudaThreadsPerBlock, 0, stream>>>(
          first, second, const_cast<float*>(combined), rows, width);
  FT_CUDA_CHECK_LAUNCH();
}

void conv_shortcut_merge_rows_cuda(float* combined, const float* first, const float* second,
                                   int64_t rows, int width, CudaStream stream) {
  if (rows <= 0 || width <= 0) return;
  split_or_merge_kernel<false>
      <<<cuda_grid_stride_blocks(rows * width), kCudaThreadsPerBlock, 0, stream>>>(
          const_cast<float*>(first), const_cast<float*>(second), combined, rows, width);
  FT_CUDA_CHECK_LAUNCH();
}

void conv_shortcut_unpack_grads_cuda(float* dw3, float* dw1, const float* packed_grad,
                                     int64_t out_by_in, CudaStream stream) {
  if (out_by_in <= 0) return;
  unpack_grads_kernel<<<cuda_grid_stride_blocks(out_by_in * kTaps), kCudaThreadsPerBlock, 0,
                        stream>>>(dw3, dw1, packed_grad, out_by_in);
  FT_CUDA_CHECK_LAUNCH();
}

// A bf16 x: the packed fp32 weight is rounded into its bf16 copy (CastOp's kernel, on the compute
// stream), which equals the two canonical copies packed, as on the CPU; the private Conv2dOp then
// runs cuDNN's bf16 convolution on it (model/ops/conv2d_bf16.cu).
void ConvShortcutOp::forward_cuda(Workspace& ws, ParamStore& params, bool bf16) {
  place_on(Device::kCuda, ws.stream, bf16);
  const int64_t out_by_in = static_cast<int64_t>(out_channels_) * in_channels_;
  conv_shortcut_pack_weights_cuda((*packed_weight_)[0].value.data(),
                                  params[this->params[0]].value.data(),
                                  params[this->params[1]].value.data(), out_by_in, ws.stream);
  if (bf16) packed_weight_->refresh_bf16_copies();
  combined_ws_.values[0] = combined_input(ws);
  combined_.forward(combined_ws_, *packed_weight_);
  const int64_t pixels = shape_numel(output_shape()) / out_channels_;
  conv_shortcut_split_rows_cuda(ws.values[outputs[0]].data(), ws.values[outputs[1]].data(),
                                combined_output_.data(), pixels, out_channels_, ws.stream);
}

// As on the CPU: dW is formed whole in the zeroed packed gradient, then added into the two
// canonical gradients.
void ConvShortcutOp::backward_cuda(Workspace& ws, ParamStore& params) {
  place_on(Device::kCuda, ws.stream, ws.values[inputs[0]].dtype() == DType::kBF16);
  const int64_t pixels = shape_numel(output_shape()) / out_channels_;
  conv_shortcut_merge_rows_cuda(combined_output_.data(), ws.grads[outputs[0]].data(),
                                ws.grads[outputs[1]].data(), pixels, out_channels_, ws.stream);
  combined_ws_.values[0] = combined_input(ws);
  if (needs_input_grad) {
    combined_ws_.grads[0] =
        Tensor::wrap(ws.grads[inputs[0]].data(), combined_.input_shape(), Device::kCuda);
    combined_ws_.grad_fresh[0] = ws.grad_is_fresh(inputs[0]) ? 1 : 0;
  }
  Tensor& packed_grad = (*packed_weight_)[0].grad;
  packed_grad.fill(0.0f);
  combined_.backward(combined_ws_, *packed_weight_);
  conv_shortcut_unpack_grads_cuda(params[this->params[0]].grad.data(),
                                  params[this->params[1]].grad.data(), packed_grad.data(),
                                  static_cast<int64_t>(out_channels_) * in_channels_, ws.stream);
}

}  // namespace ft

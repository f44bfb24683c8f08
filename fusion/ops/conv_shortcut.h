// ConvShortcutOp: horizontal fusion of a ResNet downsampling block's two convolutions of the
// same input x, the 3x3 conv1 (padding 1) and the 1x1 shortcut downsample.0 (padding 0), both of
// stride S and Cout output channels, into one 3x3 convolution with 2 Cout output channels:
//   W = [ w3 ; w1 placed at the centre tap (1, 1) of a 3x3 kernel, zeros elsewhere ]
// The sampling positions agree: output pixel i of the 1x1 reads x[S i], the centre tap of the
// 3x3 with padding 1 reads x[S i + 1 - 1] = x[S i], and both give (H - 1) / S + 1 outputs. The
// padding costs 8 multiplies per useful 1x1 multiply, (9 - 1) / (9 + 1) = 0.8 extra FLOPs over
// useful ones, which fusion/conv_shortcut_pass.cpp weighs against
// fusion.horizontal.max_padding_overhead.
// Backward is the combined convolution's: dx = sum over both branches (inside one transposed
// convolution), dW split back into dw3 = dW[:Cout] and dw1 = dW[Cout:, :, 1, 1] (the zero taps'
// gradients are dropped: they belong to no parameter).
// The unfused twin is the two Conv2dOps (model/ops/conv2d.h). Parameters stay the two canonical
// tensors; the op packs them into W at every forward and owns W and its gradient.
// Inputs {x [B,H,W,Cin]}, outputs {y3 [B,Ho,Wo,Cout], y1 [B,Ho,Wo,Cout]},
// params {w3 [Cout,Cin,3,3], w1 [Cout,Cin,1,1]}.
// On cuda (conv_shortcut.cu) the packing, the split and merge of the branches and the weight
// gradients' unpacking are kernels, and the private Conv2dOp runs cuDNN on the packed weights.
// Thread safety: one training thread per op; oneDNN parallelises inside each call.
#pragma once
#include <memory>

#include "core/device.h"
#include "core/tensor.h"
#include "model/graph.h"
#include "model/ops/conv2d.h"
#include "model/params.h"

namespace ft {

// The data movement of ConvShortcutOp on device pointers, enqueued on `stream`
// (conv_shortcut.cu; CUDA builds only). Weights are [Cout, Cin, 3, 3] (w3, the packed halves)
// and [Cout, Cin] (w1); rows are output pixels of Cout (per branch) or 2 Cout (combined) floats.
void conv_shortcut_pack_weights_cuda(float* packed, const float* w3, const float* w1,
                                     int64_t out_by_in, CudaStream stream);
void conv_shortcut_split_rows_cuda(float* first, float* second, const float* combined, int64_t rows,
                                   int width, CudaStream stream);
void conv_shortcut_merge_rows_cuda(float* combined, const float* first, const float* second,
                                   int64_t rows, int width, CudaStream stream);
// dw3 += dW[:Cout], dw1 += dW[Cout:, :, 1, 1].
void conv_shortcut_unpack_grads_cuda(float* dw3, float* dw1, const float* packed_grad,
                                     int64_t out_by_in, CudaStream stream);

class ConvShortcutOp : public Op {
 public:
  // REQUIRES: every size positive (as Conv2dOp's).
  ConvShortcutOp(int batch, int in_channels, int out_channels, int height, int width, int stride);

  OpKind op_kind() const override { return OpKind::kConvShortcut; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  OpCost cost(const Graph& graph) const override;
  bool overwrites_fresh_input_grads() const override { return needs_input_grad; }
  // x may be bf16 (train.precision: bf16): the combined convolution then reads the packed
  // weight's bf16 copy, which equals the two canonical copies packed (zeros round to zero).
  bool handles_bf16() const override { return true; }

  int out_channels() const { return out_channels_; }  // of each branch
  int stride() const { return stride_; }
  Shape output_shape() const;  // of each branch

  // As Conv2dOp's, for the combined convolution. REQUIRES: set before the first forward.
  bool needs_input_grad = true;
  ConvAlgorithm algorithm = ConvAlgorithm::kAuto;
  WinogradTile winograd_tile = WinogradTile::k4x4;

 private:
  void check_wiring(const Workspace& ws, const ParamStore& params) const;
  void pack_weights(const float* w3, const float* w1);
  // The packed weight and the combined output on `device` (rebuilt when it changes), the weight
  // with a bf16 copy once a bf16 input asked for one.
  void place_on(Device device, CudaStream stream, bool bf16_copy = false);
  // x as the combined convolution reads it, in place.
  Tensor combined_input(const Workspace& ws) const;
  // conv_shortcut.cu; CUDA builds only. bf16: x is bf16.
  void forward_cuda(Workspace& ws, ParamStore& params, bool bf16);
  void backward_cuda(Workspace& ws, ParamStore& params);  // conv_shortcut.cu; CUDA builds only

  int batch_, in_channels_, out_channels_, height_, width_, stride_;
  Conv2dOp combined_;  // 3x3, padding 1, 2 Cout outputs
  // One parameter, W [2 Cout, Cin, 3, 3], and its gradient, on the workspace's device.
  std::unique_ptr<ParamStore> packed_weight_;
  Tensor combined_output_;   // [B, Ho, Wo, 2 Cout]: forward's result, then backward's dy
  Workspace combined_ws_;    // value 0 = x, value 1 = combined_output_
  bool configured_ = false;  // combined_ has taken algorithm and winograd_tile
};

}  // namespace ft

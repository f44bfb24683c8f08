// Conv2dOp: 2-D convolution without bias, NCHW activations and OIHW weights, on oneDNN.
//   y[b,o,i,j] = sum_{c,p,q} w[o,c,p,q] * x[b, c, i*S + p - P, j*S + q - P]   (zero outside x)
// with output size (H + 2P - K) / S + 1 (floor), as in PyTorch.
// Inputs {x [B,Cin,H,W]}, outputs {y [B,Cout,Ho,Wo]}, params {weight [Cout,Cin,K,K]}.
// Thread safety: one training thread per op; oneDNN parallelises inside each call.
#pragma once
#include <cstdint>
#include <memory>

#include "model/graph.h"

namespace ft {

class Conv2dOp : public Op {
 public:
  // REQUIRES: every size positive, padding >= 0, and the output at least 1x1.
  Conv2dOp(int batch, int in_channels, int out_channels, int height, int width, int kernel,
           int stride, int padding);
  ~Conv2dOp() override;

  const char* kind() const override { return "conv2d"; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;

  int out_height() const { return out_height_; }
  int out_width() const { return out_width_; }
  Shape input_shape() const { return {batch_, in_channels_, height_, width_}; }
  Shape output_shape() const { return {batch_, out_channels_, out_height_, out_width_}; }
  Shape weight_shape() const { return {out_channels_, in_channels_, kernel_, kernel_}; }

  // False skips the input gradient (the stem conv reads the images, which need none).
  bool needs_input_grad = true;

 private:
  struct Primitives;  // oneDNN primitives and memory handles, built on first use
  void build_primitives();

  int batch_, in_channels_, out_channels_, height_, width_, kernel_, stride_, padding_;
  int out_height_, out_width_;
  std::unique_ptr<Primitives> primitives_;
  Tensor dx_scratch_;  // backward-data result before it is added into dx
  Tensor dw_scratch_;  // backward-weights result before it is added into dw
};

}  // namespace ft

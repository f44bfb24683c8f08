// Conv2dOp: 2-D convolution without bias, NCHW activations and OIHW weights, on oneDNN.
// Graph values stay plain NCHW; inside the op oneDNN may run on blocked layouts (see ConvLayout).
//   y[b,o,i,j] = sum_{c,p,q} w[o,c,p,q] * x[b, c, i*S + p - P, j*S + q - P]   (zero outside x)
// with output size (H + 2P - K) / S + 1 (floor), as in PyTorch.
// Inputs {x [B,Cin,H,W]}, outputs {y [B,Cout,Ho,Wo]}, params {weight [Cout,Cin,K,K]}.
// Thread safety: one training thread per op; oneDNN parallelises inside each call.
#pragma once
#include <cstdint>
#include <memory>

#include "model/graph.h"

namespace ft {

// Where oneDNN computes. Blocked layouts (nChw8c and friends) let the jit kernels vectorise over
// channels: 3x3 convolutions at 16+ channels run about 2x faster, reorders in and out included
// (bench/resnet_bench.cpp). With few input channels (the stem) or 1x1 kernels the reorders cost
// more than they save.
enum class ConvLayout {
  kAuto,     // blocked for kernel > 1 and in_channels >= 16, plain otherwise
  kPlain,    // nchw/oihw throughout: our buffers are used directly
  kBlocked,  // the layouts oneDNN prefers, with reorders to and from our buffers
};

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
  // REQUIRES: set before the first forward (primitives are built then).
  ConvLayout layout = ConvLayout::kAuto;
  // True once built with at least one blocked tensor (tests check which path ran).
  bool uses_blocked_layout() const;

 private:
  struct Primitives;  // oneDNN primitives, memories and reorders, built on first forward
  void build_primitives();

  int batch_, in_channels_, out_channels_, height_, width_, kernel_, stride_, padding_;
  int out_height_, out_width_;
  std::unique_ptr<Primitives> primitives_;
};

}  // namespace ft

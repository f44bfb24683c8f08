// Conv2dOp: 2-D convolution without bias on channels-last (NHWC) activations and PyTorch's OIHW
// weights, on oneDNN. In the index notation of PyTorch (NCHW), whatever the storage order:
//   y[b,o,i,j] = sum_{c,p,q} w[o,c,p,q] * x[b, c, i*S + p - P, j*S + q - P]   (zero outside x)
// with output size (H + 2P - K) / S + 1 (floor), as in PyTorch.
// Inputs {x [B,H,W,Cin]} (or [B,Cin,H,W], see input_layout), outputs {y [B,Ho,Wo,Cout]},
// params {weight [Cout,Cin,K,K]}.
// Why channels-last: oneDNN's avx2 convolutions read and write nhwc directly, at the speed of its
// blocked layouts, so activations never need a reorder, and the ops between convolutions
// (BatchNorm, ReLU, residual add) vectorise over the innermost channel dimension. Only the small
// weight tensor is reordered, into whatever the primitives want.
// On cuda (FT_RUN_ON_CUDA) all three passes run on cuDNN (conv2d.cu) whatever `algorithm` says:
// Winograd and the transposed forward are CPU-only choices.
// train.precision: bf16: x may be a bf16 value. The weight is then the parameter's bf16 copy
// (ParamStore::enable_bf16_copies) and backward rounds dy to bf16 once; y, dx and dw stay fp32
// and every product accumulates in fp32. Where the CPU has bf16 instructions
// (bf16_gemm_native()) oneDNN's bf16 direct kernels run whatever `algorithm` says, except that
// kMeasure may time Winograd on the widened operands faster for a pass and keep it; elsewhere the
// bf16 operands are widened and the fp32 passes `algorithm` chooses run on those rounded values.
// On cuda cuDNN's bf16 convolutions run (conv2d_bf16.cu; compiled, not yet run on a GPU), which
// round y, dx and dw's contribution to bf16 once before widening them into fp32.
// Thread safety: one training thread per op; oneDNN parallelises inside each call.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "model/graph.h"
#include "model/ops/winograd.h"

namespace ft {

// How a 4-D activation tensor is stored.
enum class ActivationLayout {
  kNhwc,  // [B, H, W, C]: channels innermost; every activation inside a ResNet graph
  kNchw,  // [B, C, H, W]: PyTorch's default and the data loader's images
};

// Which kernels run the three passes (forward, backward data, weight gradient).
// kTransposed: a stride-1 "same" convolution (padding (K-1)/2) equals the backward-data
// (transposed) convolution, from Cout to Cin channels, of the kernel with channels swapped and
// taps flipped, w'[c,o,K-1-p,K-1-q] = w[o,c,p,q]: x plays that convolution's output gradient and
// y its input gradient. oneDNN 2.6's avx2 backward-data kernels are faster than its forward ones
// at ResNet's shapes (3x3 at batch 64: 16 channels at 28x28 ~20%, 32 at 14x14 and 64 at 7x7 ~4%).
// kWinograd: our Winograd kernels (model/ops/winograd.h; F(4x4, 3x3) unless winograd_tile says
// F(2x2, 3x3)) do up to 4x fewer multiplies than any direct kernel. BM_Conv2dForward and
// BM_Conv2dForwardBackward in bench/resnet_bench.cpp measure every algorithm on ResNet's shapes:
// F4 takes 30-40% off oneDNN's best at all three stages, F2 about half that or less.
enum class ConvAlgorithm {
  kAuto,        // kWinograd where it applies, else kOneDnn
  kOneDnn,      // kTransposed where it applies, else kDirect
  kDirect,      // oneDNN convolution_forward, _backward_data, _backward_weights
  kTransposed,  // forward as oneDNN backward data of the flipped kernel, backward as kDirect:
                // stride 1, padding (K-1)/2, NHWC input with at least 8 channels (fewer leave
                // oneDNN's blocked kernels)
  kWinograd,    // all three passes by Winograd: 3x3, stride 1, padding 1, NHWC
                // input, input and output channels multiples of 16
  kMeasure,     // where Winograd applies: time it against what kOneDnn runs (in bf16 oneDNN's
                // bf16 kernel, Winograd on the widened operands) on the op's first forward and
                // first backward, and keep the faster for each pass (conv2d_measure.cpp); else
                // as kOneDnn. Like cuDNN's autotuning, the choice may differ between runs.
};

// The geometry of one convolution for cuDNN. nchw_input: our input is stored NCHW (the stem
// reading images); cuDNN is handed an NHWC copy of it (model/ops/conv2d_layout.h).
struct CudnnConvShape {
  int batch = 0, in_channels = 0, out_channels = 0, height = 0, width = 0;
  int kernel = 0, stride = 1, padding = 0, out_height = 0, out_width = 0;
  bool nchw_input = false;
};
// The shape of a convolution with these sizes; the output size follows from them, and a one-channel
// input is NHWC whatever `input_layout` says (NCHW and NHWC are then the same bytes).
CudnnConvShape cudnn_conv_shape(int batch, int in_channels, int out_channels, int height, int width,
                                int kernel, int stride, int padding, ActivationLayout input_layout);
// cuDNN descriptors and the algorithms chosen for one convolution (conv2d.cu; CUDA builds only).
struct CudnnConv;
std::shared_ptr<CudnnConv> make_cudnn_conv(const CudnnConvShape& shape);
// y = conv(x, weight) on device pointers, weight OIHW, enqueued on `stream`.
void conv2d_forward_cuda(float* y, const float* x, const float* weight, CudnnConv& conv,
                         CudaStream stream);
// dweight += correlation of x with dy; dx += transposed convolution of dy (= when dx_fresh);
// dx null skips the input gradient.
void conv2d_backward_cuda(float* dx, float* dweight, const float* dy, const float* x,
                          const float* weight, bool dx_fresh, CudnnConv& conv, CudaStream stream);
// The bf16 forms (conv2d_bf16.cu; CUDA builds only): x and weight (the parameter's bf16 copy)
// bf16, y, dx and dweight fp32, each rounded to bf16 by cuDNN before it is widened into them; dy
// is rounded to bf16 once.
void conv2d_forward_bf16_cuda(float* y, const bf16_bits* x, const bf16_bits* weight,
                              CudnnConv& conv, CudaStream stream);
void conv2d_backward_bf16_cuda(float* dx, float* dweight, const float* dy, const bf16_bits* x,
                               const bf16_bits* weight, bool dx_fresh, CudnnConv& conv,
                               CudaStream stream);

class Conv2dOp : public Op {
 public:
  // REQUIRES: every size positive, padding >= 0, and the output at least 1x1.
  Conv2dOp(int batch, int in_channels, int out_channels, int height, int width, int kernel,
           int stride, int padding);
  ~Conv2dOp() override;

  OpKind op_kind() const override { return OpKind::kConv2d; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  OpCost cost(const Graph& graph) const override;
  bool overwrites_fresh_input_grads() const override { return needs_input_grad; }
  bool handles_bf16() const override { return true; }

  int batch() const { return batch_; }
  int in_channels() const { return in_channels_; }
  int out_channels() const { return out_channels_; }
  int height() const { return height_; }  // of the input
  int width() const { return width_; }
  int kernel() const { return kernel_; }
  int stride() const { return stride_; }
  int padding() const { return padding_; }
  int out_height() const { return out_height_; }
  int out_width() const { return out_width_; }
  Shape input_shape() const;  // in input_layout
  Shape output_shape() const { return {batch_, out_height_, out_width_, out_channels_}; }
  Shape weight_shape() const { return {out_channels_, in_channels_, kernel_, kernel_}; }

  // False skips the input gradient (the stem conv reads the images, which need none).
  bool needs_input_grad = true;
  // kNchw lets the stem read the images as the data loader writes them (identical to NHWC when
  // there is one channel). REQUIRES: set before the first forward (primitives are built then).
  ActivationLayout input_layout = ActivationLayout::kNhwc;
  // REQUIRES: set before the first forward; a forced algorithm only where it applies (else
  // resolved_algorithm throws, naming the condition that failed).
  ConvAlgorithm algorithm = ConvAlgorithm::kAuto;
  // Which Winograd variant kWinograd runs. REQUIRES: set before the first forward.
  WinogradTile winograd_tile = WinogradTile::k4x4;
  // kDirect, kTransposed or kWinograd: what `algorithm` means for this shape and input_layout
  // (for an fp32 input, or a widened bf16 one; oneDNN's bf16 kernels always run kDirect).
  ConvAlgorithm resolved_algorithm() const;
  // The forward implementation's name: oneDNN's ("jit:avx2", "x64:gemm:jit",
  // "jit_bf16:avx512_core_bf16", ...) or "winograd:f4x4_3x3", prefixed "widened:" when a bf16
  // input is widened to fp32 first; for tests and benchmarks that check no slow fallback was
  // chosen. Empty before the first forward.
  const char* forward_impl() const;
  // kMeasure: the timings and the choice for each pass measured so far, e.g. "forward
  // winograd:f4x4_3x3 1.200 ms <= brgconv:avx512_core_bf16 1.410 ms"; empty otherwise.
  std::string runtime_choice() const override { return measured_choice_; }
  CudnnConvShape cudnn_shape() const;

 private:
  struct Primitives;  // conv2d_primitives.h: built on first forward for the input's dtype
  void build_primitives(DType input);
  // oneDNN primitives running `conv_algorithm` (kDirect or kTransposed) with `operands` (what
  // src, weights and diff_dst hold; kTransposed fp32 only). Null for bf16 operands oneDNN has no
  // fast kernel for.
  std::unique_ptr<Primitives> make_onednn_primitives(ConvAlgorithm conv_algorithm,
                                                     DType operands) const;
  // kMeasure where Winograd applies: Winograd's primitives beside primitives_ (what kOneDnn
  // runs). Null otherwise.
  std::unique_ptr<Primitives> make_measured_alternative(DType input) const;
  // Winograd's state for `input` (widened first when bf16).
  std::unique_ptr<Primitives> make_winograd_primitives(DType input) const;
  bool winograd_applies() const;  // 3x3 "same", NHWC, channels Winograd supports
  // The three passes on the primitives' operands (fp32, or bf16 on the native path); the
  // weights are re-derived when `weight_source` or the parameters' `version` changed.
  void run_forward(Primitives& p, float* y, const void* x, const void* weight,
                   const void* weight_source, uint64_t version);
  // dx null skips the input gradient.
  void run_backward(Primitives& p, float* dx, bool dx_fresh, float* dweight, const void* dy,
                    const void* x, const void* weight);
  // One pass with `p` from the op's tensors: x as stored, widened first when p widens; in bf16
  // the weight's copy and dy rounded to bf16.
  void forward_with(Primitives& p, float* y, const Tensor& x, const Param& weight,
                    uint64_t version);
  void backward_with(Primitives& p, float* dx, bool dx_fresh, float* dweight, const Param& weight,
                     const float* dy, const Tensor& x);
  // kMeasure: times primitives_ against alternative_ on this pass's real operands (into scratch
  // for backward), records the result in measured_choice_ and returns the faster, which the
  // caller then runs for real.
  Primitives& measure_forward(float* y, const Tensor& x, const Param& weight, uint64_t version);
  Primitives& measure_backward(bool with_dx, const Param& weight, const float* dy, const Tensor& x);
  // The widening path: the weight's bf16 copy widened into p's buffer.
  float* widened_weights(Primitives& p, const bf16_bits* weight_copy);
  WinogradShape winograd_shape() const;
  CudnnConv& cudnn_conv();  // cudnn_, made on first use (conv2d.cu; CUDA builds only)

  int batch_, in_channels_, out_channels_, height_, width_, kernel_, stride_, padding_;
  int out_height_, out_width_;
  std::unique_ptr<Primitives> primitives_;
  std::unique_ptr<Primitives> alternative_;  // kMeasure: Winograd, until both passes chose
  Primitives* forward_choice_ = nullptr;     // kMeasure: null until measured
  Primitives* backward_choice_ = nullptr;
  std::string measured_choice_;
  std::shared_ptr<CudnnConv> cudnn_;  // on cuda: made on first forward
};

}  // namespace ft

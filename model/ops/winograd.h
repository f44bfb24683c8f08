// Winograd F(2x2, 3x3) and F(4x4, 3x3) kernels (Lavin and Gray, "Fast Algorithms for
// Convolutional Neural Networks", 2015) for the 3x3, stride-1, padding-1 convolutions that make
// up most of a ResNet, on channels-last (NHWC) activations. Each m x m block of outputs comes from
// an (m+2) x (m+2) input tile:
//   y_tile = A^T [ (G w G^T) (.) (B^T x_tile B) ] A          ((.) is the elementwise product)
// The elementwise product, summed over input channels, is (m+2)^2 small GEMMs: per output, F2
// does 4 multiplies and F4 2.25 where direct convolution does 9, plus transforms that only add
// and scale.
// The same kernel runs backward data (the convolution of dy with the flipped, channel-swapped
// kernel), and the weight gradient follows from differentiating the formula above:
//   dL/d(G w G^T) = sum over tiles of (A dy_tile A^T) (.) (B^T x_tile B),  dL/dw = G^T [.] G
// F2's transforms hold only 0, +-1 and +-1/2, so it is as accurate as direct convolution in
// float32; F4's larger coefficients lose about one decimal digit (tests/resnet_winograd_test.cpp
// bounds both against a double-precision direct convolution).
// Thread safety: calls are independent; each parallelises over tile blocks with OpenMP.
#pragma once
#include <cstdint>

namespace ft {

// Output block per tile: F(2x2, 3x3) or F(4x4, 3x3).
enum class WinogradTile { k2x2, k4x4 };

struct WinogradShape {
  int batch = 0;
  int height = 0;  // input and output (stride 1, padding 1)
  int width = 0;
  int in_channels = 0;
  int out_channels = 0;
  WinogradTile tile = WinogradTile::k4x4;
};

// Which convolution winograd_transform_weights prepares for.
enum class WinogradPass {
  kForward,       // y = conv(x, w): U[points][in][out]
  kBackwardData,  // dx = conv(dy, w'), w'[c,o,p,q] = w[o,c,2-p,2-q]: U[points][out][in]
};

// Whether to overwrite the output or add into it (a gradient that already holds a shortcut's).
enum class WinogradWrite { kOverwrite, kAccumulate };

// The kernels' vector width. By default the widest the build compiled and the CPU runs: AVX-512
// (16 lanes) on CPUs that have it, else AVX2 (8 lanes). Every width computes the same sums in
// the same order within a lane, but its register tiles group them differently, so results may
// differ in the last bits between widths (never between runs of one width). The environment
// variable FT_CPU_ISA=avx2 selects the AVX2 kernels on an AVX-512 CPU (to compare, or to
// reproduce an AVX2 machine's bits); a value other than avx2 or avx512, or avx512 on a CPU
// without it, makes the first Winograd call throw an error that names the variable.
enum class WinogradIsa { kAvx2, kAvx512 };
WinogradIsa winograd_isa();
bool winograd_isa_available(WinogradIsa isa);
// For tests and benchmarks, which compare widths on one machine. Not thread-safe against running
// kernels. REQUIRES: winograd_isa_available(isa) (else throws).
void winograd_set_isa(WinogradIsa isa);
const char* winograd_isa_name(WinogradIsa isa);  // "avx2", "avx512"

// Whether the kernels take these channel counts: multiples of 16, one register tile wide.
bool winograd_supports(int in_channels, int out_channels);

// Floats in the transformed weights: points (16 or 36) * in_channels * out_channels.
int64_t winograd_weights_numel(int in_channels, int out_channels, WinogradTile tile);

// transformed = the transformed 3x3 kernels laid out for `pass`.
// REQUIRES: transformed holds winograd_weights_numel floats; weight is OIHW [out, in, 3, 3].
void winograd_transform_weights(float* transformed, const float* weight, int out_channels,
                                int in_channels, WinogradTile tile, WinogradPass pass);

// y (=, or += for kAccumulate) conv(x, w), x [B,H,W,in], y [B,H,W,out], with transformed from
// winograd_transform_weights(kForward). Backward data is the same call with dy as x, dx as y,
// in/out swapped and transformed from kBackwardData; transformed was made for shape.tile.
// REQUIRES: winograd_supports(in, out); x and y do not overlap.
void winograd_conv(float* y, const float* x, const float* transformed, const WinogradShape& shape,
                   WinogradWrite write);

// What the inference convolution (ConvBiasOp, fusion/ops/conv_bias.h) applies to each output
// inside the output transform, while the block is still in registers:
//   y = act(conv(x, w) + bias[o] + residual)
// so a folded BatchNorm's shift, a block's residual add and its ReLU cost no pass over memory.
// Ownership: the pointers are borrowed for the call. Null `bias` or `residual` leaves the term out.
struct WinogradEpilogue {
  const float* bias = nullptr;      // [out]
  const float* residual = nullptr;  // [B,H,W,out], like y; must not overlap y
  bool relu = false;
};

// y = epilogue(conv(x, w)), forward only. REQUIRES: as winograd_conv.
void winograd_conv_inference(float* y, const float* x, const float* transformed,
                             const WinogradShape& shape, const WinogradEpilogue& epilogue);

// weight_grad [out, in, 3, 3] += sum_{b,i,j} dy[b,i,j,o] x[b, i+p-1, j+q-1, c].
// REQUIRES: winograd_supports(in, out).
void winograd_conv_weight_grad(float* weight_grad, const float* x, const float* dy,
                               const WinogradShape& shape);

}  // namespace ft

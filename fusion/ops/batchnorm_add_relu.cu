// BatchNormAddReluOp on CUDA: each branch's statistics are BatchNorm's own launches
// (batchnorm_train_statistics_cuda in kernels/batchnorm.cu; backward's with the ReLU mask,
// batchnorm_relu_backward_statistics_cuda in batchnorm_relu_kernels.cu), then one elementwise
// kernel per direction with the helpers the CPU loops call. Forward may write y in bf16
// (train.precision: bf16); backward then reads the mask from y widened by the op
// (batchnorm_add_relu_op.cpp), as the CPU's identity shortcut does.
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "core/math/bf16_math.h"
#include "fusion/ops/batchnorm_add_relu.h"
#include "fusion/ops/batchnorm_relu_kernels.h"
#include "kernels/batchnorm_math.h"
#include "model/ops/relu.h"

namespace ft {
namespace {

// coefficients and s_coefficients hold {scale, shift} [2][C]; Y is float, or bf16_bits where y
// is a convolution's bf16 operand (rounded once, as the CPU's).
template <bool kNormalised, typename Y>
__global__ void add_relu_kernel(Y* y, const float* x, const float* coefficients,
                                const float* shortcut, const float* s_coefficients, int64_t numel,
                                int channels) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    const int c = static_cast<int>(i % channels);
    const float z = batchnorm_scale_shift(coefficients[c], x[i], coefficients[channels + c]);
    const float s = kNormalised ? batchnorm_scale_shift(s_coefficients[c], shortcut[i],
                                                        s_coefficients[channels + c])
                                : shortcut[i];
    store_value(y + i, relu_value(z + s));
  }
}

// What the shortcut's gradient gets: nothing, = or +=.
constexpr int kShortcutNone = 0, kShortcutFresh = 1, kShortcutAccumulate = 2;

// k and s_k hold {k_dy, k_x, k_0} [3][C]; ds is dr, or BN_s's dx_s when kNormalised.
template <bool kNormalised, bool kFreshX, int kShortcut>
__global__ void gradient_kernel(float* dx, float* ds, const float* dy, const float* y,
                                const float* x, const float* mean, const float* k, const float* xs,
                                const float* s_mean, const float* s_k, int64_t numel,
                                int channels) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    const int c = static_cast<int>(i % channels);
    const float du = relu_gradient(dy[i], y[i]);
    const float gx =
        batchnorm_input_gradient(k[c], du, k[channels + c], x[i] - mean[c], k[2 * channels + c]);
    dx[i] = kFreshX ? gx : dx[i] + gx;
    if (kShortcut == kShortcutNone) continue;
    const float gs = kNormalised
                         ? batchnorm_input_gradient(s_k[c], du, s_k[channels + c],
                                                    xs[i] - s_mean[c], s_k[2 * channels + c])
                         : du;
    ds[i] = kShortcut == kShortcutFresh ? gs : ds[i] + gs;
  }
}

using GradientKernel = void (*)(float*, float*, const float*, const float*, const float*,
                                const float*, const float*, const float*, const float*,
                                const float*, int64_t, int);

template <bool kNormalised, bool kFreshX>
GradientKernel pick(int shortcut) {
  if (shortcut == kShortcutNone) return gradient_kernel<kNormalised, kFreshX, kShortcutNone>;
  if (shortcut == kShortcutFresh) return gradient_kernel<kNormalised, kFreshX, kShortcutFresh>;
  return gradient_kernel<kNormalised, kFreshX, kShortcutAccumulate>;
}

GradientKernel pick(bool normalised, bool dx_fresh, int shortcut) {
  if (normalised) return dx_fresh ? pick<true, true>(shortcut) : pick<true, false>(shortcut);
  return dx_fresh ? pick<false, true>(shortcut) : pick<false, false>(shortcut);
}

template <typename Y>
void forward(Y* y, const BatchNormBranch& main, const BatchNormBranch* shortcut_bn,
             const BatchNormAddReluIdentity& identity, int64_t rows, int channels,
             CudaStream stream) {
  if (rows <= 0 || channels <= 0) return;
  for (const BatchNormBranch* b : {&main, shortcut_bn}) {
    if (b == nullptr) continue;
    batchnorm_train_statistics_cuda(b->saved_mean, b->saved_invstd, b->running_mean, b->running_var,
                                    b->partials, b->coefficients, b->x, b->gamma, b->beta, rows,
                                    channels, b->momentum, b->eps, stream);
  }
  const bool normalised = shortcut_bn != nullptr;
  const auto kernel = normalised ? add_relu_kernel<true, Y> : add_relu_kernel<false, Y>;
  const int64_t numel = rows * channels;
  kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
      y, main.x, main.coefficients, normalised ? shortcut_bn->x : identity.r,
      normalised ? shortcut_bn->coefficients : nullptr, numel, channels);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void batchnorm_add_relu_forward_cuda(float* y, const BatchNormBranch& main,
                                     const BatchNormBranch* shortcut_bn,
                                     const BatchNormAddReluIdentity& identity, int64_t rows,
                                     int channels, CudaStream stream) {
  forward(y, main, shortcut_bn, identity, rows, channels, stream);
}

void batchnorm_add_relu_forward_cuda(bf16_bits* y, const BatchNormBranch& main,
                                     const BatchNormBranch* shortcut_bn,
                                     const BatchNormAddReluIdentity& identity, int64_t rows,
                                     int channels, CudaStream stream) {
  forward(y, main, shortcut_bn, identity, rows, channels, stream);
}

void batchnorm_add_relu_backward_cuda(const float* dy, const float* y, const BatchNormBranch& main,
                                      const BatchNormBranch* shortcut_bn,
                                      const BatchNormAddReluIdentity& identity, int64_t rows,
                                      int channels, CudaStream stream) {
  if (rows <= 0 || channels <= 0) return;
  for (const BatchNormBranch* b : {&main, shortcut_bn}) {
    if (b == nullptr) continue;
    batchnorm_relu_backward_statistics_cuda(b->dgamma, b->dbeta, b->partials, b->coefficients, dy,
                                            y, b->x, b->gamma, b->saved_mean, b->saved_invstd, rows,
                                            channels, stream);
  }
  const bool normalised = shortcut_bn != nullptr;
  float* ds = normalised ? shortcut_bn->dx : identity.dr;
  const bool ds_fresh = normalised ? shortcut_bn->dx_fresh : identity.dr_fresh;
  const int shortcut =
      ds == nullptr ? kShortcutNone : (ds_fresh ? kShortcutFresh : kShortcutAccumulate);
  const GradientKernel kernel = pick(normalised, main.dx_fresh, shortcut);
  const int64_t numel = rows * channels;
  kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
      main.dx, ds, dy, y, main.x, main.saved_mean, main.coefficients,
      normalised ? shortcut_bn->x : nullptr, normalised ? shortcut_bn->saved_mean : nullptr,
      normalised ? shortcut_bn->coefficients : nullptr, numel, channels);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft

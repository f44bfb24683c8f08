// BatchNormAddReluOp on the CPU. Forward statistics come from batchnorm_train_statistics
// (kernels/batchnorm.h); backward's from batchnorm_relu_backward_statistics
// (batchnorm_relu_kernels.h) with an identity shortcut, and from pair_backward_statistics (both
// BatchNorms in one pass, the mask recomputed from x and x_s) with a shortcut BatchNorm. One
// elementwise pass per direction does the rest, with the helpers the unfused ops use
// (batchnorm_scale_shift, batchnorm_input_gradient, relu_value, relu_gradient) and the unfused
// reductions' summation order, so the two agree bit for bit. The op's wiring is in
// batchnorm_add_relu_op.cpp.
#include "fusion/ops/batchnorm_add_relu.h"

#include <algorithm>

#include "core/check.h"
#include "fusion/ops/batchnorm_relu_kernels.h"
#include "fusion/ops/batchnorm_relu_math.h"
#include "kernels/batchnorm_lanes.h"
#include "kernels/batchnorm_math.h"
#include "model/ops/relu.h"

namespace ft {
namespace {

// y's element type: fp32, or bf16 rounded once from the fp32 value (fusion.vertical.cast).
inline float output_value(float value, float*) {
  return value;
}
inline bf16_bits output_value(float value, bf16_bits*) {
  return float_to_bf16(value);
}

// y = relu(scale x + shift + s), with s = the shortcut, or s = s_scale x_s + s_shift when
// kNormalised (x_s = shortcut). Out is float or bf16_bits.
template <bool kNormalised, typename Out>
void add_relu_rows(Out* y, const float* x, const float* scale, const float* shift,
                   const float* shortcut, const float* s_scale, const float* s_shift, int64_t rows,
                   int channels) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = r * channels;
#pragma omp simd
    for (int c = 0; c < channels; ++c) {
      const float z = batchnorm_scale_shift(scale[c], x[row + c], shift[c]);
      const float s = kNormalised ? batchnorm_scale_shift(s_scale[c], shortcut[row + c], s_shift[c])
                                  : shortcut[row + c];
      y[row + c] = output_value(relu_value(z + s), y);
    }
  }
}

// What the shortcut's gradient pass writes: nothing (an input without a gradient), = or +=.
enum class ShortcutWrite { kNone, kFresh, kAccumulate };

struct GradientPass {
  float* dx;
  float* ds;                           // dr, or BN_s's dx_s
  const float *dy, *y, *x, *mean, *k;  // k = {k_dy, k_x, k_0} [3][C]
  const float *xs, *s_mean, *s_k;      // BN_s only
  const float *scale, *s_scale;        // BN_s only: forward's {scale, shift} [2][C] of each
  int64_t rows;
  int channels;
};

// u = z + z_s with both normalisations recomputed as forward computed them (add_relu_rows), so
// u > 0 exactly where y > 0, and du = dy [u > 0]. V is float or Lanes.
template <typename V>
V pair_masked_dy(V dy, V x, V xs, V scale, V shift, V s_scale, V s_shift) {
  const V zero = {};
  const V u = batchnorm_scale_shift(scale, x, shift) + batchnorm_scale_shift(s_scale, xs, s_shift);
  return batchnorm_relu_masked(dy, u, zero);
}

// du = dy [y > 0] (with BN_s recomputed from x and x_s instead, so y is not read);
// dx (+)= k_dy du + k_x (x - mean) + k_0, and ds (+)= du, or BN_s's same expression in x_s when
// kNormalised.
template <bool kNormalised, bool kFreshX, ShortcutWrite kShortcut>
void gradient_rows(const GradientPass& p) {
  const int channels = p.channels;
  const float *k_dy = p.k, *k_x = p.k + channels, *k_0 = p.k + 2 * channels;
  const float *s_k_dy = p.s_k, *s_k_x = p.s_k + channels, *s_k_0 = p.s_k + 2 * channels;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t row = r * channels;
#pragma omp simd
    for (int c = 0; c < channels; ++c) {
      const int64_t at = row + c;
      const float du =
          kNormalised ? pair_masked_dy(p.dy[at], p.x[at], p.xs[at], p.scale[c],
                                       p.scale[channels + c], p.s_scale[c], p.s_scale[channels + c])
                      : relu_gradient(p.dy[at], p.y[at]);
      const float gx = batchnorm_input_gradient(k_dy[c], du, k_x[c], p.x[at] - p.mean[c], k_0[c]);
      p.dx[at] = kFreshX ? gx : p.dx[at] + gx;
      if (kShortcut == ShortcutWrite::kNone) continue;
      const float gs = kNormalised ? batchnorm_input_gradient(s_k_dy[c], du, s_k_x[c],
                                                              p.xs[at] - p.s_mean[c], s_k_0[c])
                                   : du;
      p.ds[at] = kShortcut == ShortcutWrite::kFresh ? gs : p.ds[at] + gs;
    }
  }
}

template <bool kNormalised, bool kFreshX>
void gradient_rows(const GradientPass& pass, ShortcutWrite shortcut) {
  if (shortcut == ShortcutWrite::kNone)
    gradient_rows<kNormalised, kFreshX, ShortcutWrite::kNone>(pass);
  else if (shortcut == ShortcutWrite::kFresh)
    gradient_rows<kNormalised, kFreshX, ShortcutWrite::kFresh>(pass);
  else
    gradient_rows<kNormalised, kFreshX, ShortcutWrite::kAccumulate>(pass);
}

template <bool kNormalised>
void gradient_rows(const GradientPass& pass, bool dx_fresh, ShortcutWrite shortcut) {
  if (dx_fresh)
    gradient_rows<kNormalised, true>(pass, shortcut);
  else
    gradient_rows<kNormalised, false>(pass, shortcut);
}

// Backward's reduction pass of both BatchNorms at once, reading dy, x and x_s (not y, and not dy
// twice): over the rows of a chunk, first[c] = sum du, second[c] = sum du (x - mean) and
// third[c] = sum du (x_s - mean_s). Rows alternate between two accumulators, as in
// kernels/batchnorm_loops.h's reduction, so each sum is the one the unfused BatchNorm forms, bit
// for bit.
void pair_sums_chunk(const GradientPass& p, int64_t begin, int64_t end, float* first, float* second,
                     float* third) {
  using namespace batchnorm_lanes;
  const int channels = p.channels;
  const int vector_channels = channels - channels % kLanes;
  const float *shift = p.scale + channels, *s_shift = p.s_scale + channels;
  for (int c = 0; c < vector_channels; c += kLanes) {
    const Lanes mean = load(p.mean + c), s_mean = load(p.s_mean + c);
    const Lanes scale = load(p.scale + c), shift_c = load(shift + c);
    const Lanes s_scale = load(p.s_scale + c), s_shift_c = load(s_shift + c);
    Lanes sums[2][3] = {};  // [row parity][first, second, third]
    for (int64_t r = begin; r < end; ++r) {
      const int64_t at = r * channels + c;
      const Lanes x = load(p.x + at), xs = load(p.xs + at);
      const Lanes du = pair_masked_dy(load(p.dy + at), x, xs, scale, shift_c, s_scale, s_shift_c);
      Lanes* acc = sums[(r - begin) % 2];
      acc[0] += du;
      acc[1] += du * (x - mean);
      acc[2] += du * (xs - s_mean);
    }
    store(first + c, sums[0][0] + sums[1][0]);
    store(second + c, sums[0][1] + sums[1][1]);
    store(third + c, sums[0][2] + sums[1][2]);
  }
  for (int c = vector_channels; c < channels; ++c) {
    float first_sum = 0.0f, second_sum = 0.0f, third_sum = 0.0f;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t at = r * channels + c;
      const float du = pair_masked_dy(p.dy[at], p.x[at], p.xs[at], p.scale[c], shift[c],
                                      p.s_scale[c], s_shift[c]);
      first_sum += du;
      second_sum += du * (p.x[at] - p.mean[c]);
      third_sum += du * (p.xs[at] - p.s_mean[c]);
    }
    first[c] = first_sum;
    second[c] = second_sum;
    third[c] = third_sum;
  }
}

// pair_sums_chunk over every row, the chunks summed in double in chunk order; then each branch's
// dgamma, dbeta += and input-gradient coefficients {k_dy, k_x, k_0} into its scratch.
void pair_backward_statistics(const GradientPass& p, const BatchNormBranch& main,
                              const BatchNormBranch& shortcut_bn,
                              std::array<BatchNormScratch, 2>& scratch) {
  const int channels = p.channels;
  const int64_t chunks =
      (p.rows + batchnorm_lanes::kRowsPerChunk - 1) / batchnorm_lanes::kRowsPerChunk;
  std::vector<float>& partials = scratch[0].chunk_sums;
  partials.resize(static_cast<size_t>(chunks) * 3 * channels);
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    float* sums = partials.data() + chunk * 3 * channels;
    pair_sums_chunk(p, chunk * batchnorm_lanes::kRowsPerChunk,
                    std::min(p.rows, (chunk + 1) * batchnorm_lanes::kRowsPerChunk), sums,
                    sums + channels, sums + 2 * channels);
  }
  std::vector<double>& totals = scratch[0].sums;
  totals.assign(3 * static_cast<size_t>(channels), 0.0);
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    for (int i = 0; i < 3 * channels; ++i) totals[i] += partials[chunk * 3 * channels + i];
  const double count = static_cast<double>(p.rows);
  for (int which = 0; which < 2; ++which) {
    const BatchNormBranch& b = which == 0 ? main : shortcut_bn;
    const double* sum_du_centred = totals.data() + (which + 1) * channels;
    std::vector<float>& k = scratch[which].coefficients;
    k.resize(3 * static_cast<size_t>(channels));
    for (int c = 0; c < channels; ++c) {
      const BatchNormBackwardCoefficients coefficients = batchnorm_backward_coefficients(
          totals[c], sum_du_centred[c], b.gamma[c], b.saved_invstd[c], count);
      b.dbeta[c] += coefficients.dbeta;
      b.dgamma[c] += coefficients.dgamma;
      k[c] = coefficients.k_dy;
      k[channels + c] = coefficients.k_x;
      k[2 * channels + c] = coefficients.k_0;
    }
  }
}

ShortcutWrite shortcut_write(const float* ds, bool fresh) {
  if (ds == nullptr) return ShortcutWrite::kNone;
  return fresh ? ShortcutWrite::kFresh : ShortcutWrite::kAccumulate;
}

}  // namespace

namespace {

template <typename Out>
void add_relu_forward(Out* y, const BatchNormBranch& main, const BatchNormBranch* shortcut_bn,
                      const BatchNormAddReluIdentity& identity, int64_t rows, int channels,
                      std::array<BatchNormScratch, 2>& scratch) {
  batchnorm_train_statistics(main.saved_mean, main.saved_invstd, main.running_mean,
                             main.running_var, main.x, main.gamma, main.beta, rows, channels,
                             main.momentum, main.eps, scratch[0]);
  const float* scale = scratch[0].coefficients.data();
  if (shortcut_bn == nullptr) {
    add_relu_rows<false>(y, main.x, scale, scale + channels, identity.r, nullptr, nullptr, rows,
                         channels);
    return;
  }
  const BatchNormBranch& s = *shortcut_bn;
  batchnorm_train_statistics(s.saved_mean, s.saved_invstd, s.running_mean, s.running_var, s.x,
                             s.gamma, s.beta, rows, channels, s.momentum, s.eps, scratch[1]);
  const float* s_scale = scratch[1].coefficients.data();
  add_relu_rows<true>(y, main.x, scale, scale + channels, s.x, s_scale, s_scale + channels, rows,
                      channels);
}

}  // namespace

void batchnorm_add_relu_forward(float* y, const BatchNormBranch& main,
                                const BatchNormBranch* shortcut_bn,
                                const BatchNormAddReluIdentity& identity, int64_t rows,
                                int channels, std::array<BatchNormScratch, 2>& scratch) {
  add_relu_forward(y, main, shortcut_bn, identity, rows, channels, scratch);
}
void batchnorm_add_relu_forward(bf16_bits* y, const BatchNormBranch& main,
                                const BatchNormBranch* shortcut_bn,
                                const BatchNormAddReluIdentity& identity, int64_t rows,
                                int channels, std::array<BatchNormScratch, 2>& scratch) {
  add_relu_forward(y, main, shortcut_bn, identity, rows, channels, scratch);
}

void batchnorm_add_relu_backward(const float* dy, const float* y, const BatchNormBranch& main,
                                 const BatchNormBranch* shortcut_bn,
                                 const BatchNormAddReluIdentity& identity, int64_t rows,
                                 int channels, std::array<BatchNormScratch, 2>& scratch) {
  GradientPass pass{main.dx,         identity.dr, dy,      y,       main.x,
                    main.saved_mean, nullptr,     nullptr, nullptr, nullptr,
                    nullptr,         nullptr,     rows,    channels};
  if (shortcut_bn == nullptr) {
    // The reduction reads du = dy [y > 0] straight from dy and y.
    batchnorm_relu_backward_statistics(main.dgamma, main.dbeta, dy, BatchNormMask::kReluOutput, y,
                                       main.x, main.gamma, main.beta, main.saved_mean,
                                       main.saved_invstd, rows, channels, scratch[0]);
    pass.k = scratch[0].coefficients.data();
    gradient_rows<false>(pass, main.dx_fresh, shortcut_write(identity.dr, identity.dr_fresh));
    return;
  }
  // Both passes recompute u = z + z_s from x and x_s, which they read anyway, instead of y.
  const BatchNormBranch& s = *shortcut_bn;
  for (int which = 0; which < 2; ++which) {
    const BatchNormBranch& b = which == 0 ? main : s;
    std::vector<float>& normalisation = scratch[which].mask_coefficients;
    normalisation.resize(2 * static_cast<size_t>(channels));
    normalisation_coefficients(normalisation.data(), normalisation.data() + channels, b.gamma,
                               b.beta, b.saved_mean, b.saved_invstd, channels);
  }
  pass.ds = s.dx;
  pass.xs = s.x;
  pass.s_mean = s.saved_mean;
  pass.scale = scratch[0].mask_coefficients.data();
  pass.s_scale = scratch[1].mask_coefficients.data();
  pair_backward_statistics(pass, main, s, scratch);
  pass.k = scratch[0].coefficients.data();
  pass.s_k = scratch[1].coefficients.data();
  gradient_rows<true>(pass, main.dx_fresh, shortcut_write(s.dx, s.dx_fresh));
}

}  // namespace ft

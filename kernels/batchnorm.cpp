// BatchNorm on NHWC: a channel is every C-th float, so each row of C channels is a few 8-float
// vectors and the per-channel statistics are vectors of partial sums. Each direction reads the
// activations twice: once to reduce the statistics, once for the elementwise pass. Reductions
// sum a chunk of rows in float and the chunks in double, so large batches keep float precision.
//
// The loops use GCC/Clang vector extensions (Lanes) over blocks of 8 channels, with a scalar
// tail for channel counts that are not a multiple of 8. Written as plain per-row loops over C,
// GCC keeps the partial sums in memory: a reduction pass over [64, 28, 28, 16] took 0.28 ms
// instead of 0.07 ms (BM_BatchNormForwardBackward in bench/resnet_bench.cpp times the op).
// The ReLU variants (kRelu, relu_output) evaluate the very same expressions as BatchNorm followed
// by ReluOp, so BatchNormReluOp agrees with the unfused pair bit for bit.
#include "kernels/batchnorm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/check.h"
#include "kernels/batchnorm_lanes.h"
#include "kernels/batchnorm_math.h"

namespace ft {
namespace {

using batchnorm_lanes::kLanes;
using batchnorm_lanes::kRowsPerChunk;
using batchnorm_lanes::Lanes;
using batchnorm_lanes::load;
using batchnorm_lanes::store;

// Where backward's dz comes from (see BatchNormMask): y for kReluOutput, the normalisation's
// {scale, shift} [C] each for kRecomputed.
struct MaskSource {
  const float* y = nullptr;
  const float* scale = nullptr;
  const float* shift = nullptr;
};

// dz at element `at` (channel c) of rows of x: dy, or dy where the ReLU passed its input, which is
// y > 0, or equally z = scale x + shift > 0 recomputed with forward's expression (batchnorm_math.h
// helpers, so the mask is the same bit for bit). V is Lanes (channels c..c+7) or float.
template <BatchNormMask kMask, typename V>
V masked_dy(V dy, V x, int64_t at, int c, const MaskSource& mask) {
  V zero = {};
  if constexpr (kMask == BatchNormMask::kNone) {
    return dy;
  } else if constexpr (kMask == BatchNormMask::kReluOutput) {
    V y;
    std::memcpy(&y, mask.y + at, sizeof y);
    return batchnorm_relu_masked(dy, y, zero);
  } else {
    V scale, shift;
    std::memcpy(&scale, mask.scale + c, sizeof scale);
    std::memcpy(&shift, mask.shift + c, sizeof shift);
    return batchnorm_relu_masked(dy, batchnorm_scale_shift<false>(scale, x, shift, zero), zero);
  }
}

// Over rows [begin, end) of x, with d = x - centre[c] and w = d, or w = dz (kWeighted; dz from
// dy by kMask): first[c] = sum w, second[c] = sum w * d. Two row accumulators per vector hide
// the add latency.
template <bool kWeighted, BatchNormMask kMask>
void sum_centred_chunk(const float* x, const float* dy, const MaskSource& mask, const float* centre,
                       int64_t begin, int64_t end, int channels, float* first, float* second) {
  const int vector_channels = channels - channels % kLanes;
  auto weight_at = [&](int64_t at, int c, Lanes x_lanes, Lanes d) {
    if (!kWeighted) return d;
    return masked_dy<kMask>(load(dy + at), x_lanes, at, c, mask);
  };
  for (int c = 0; c < vector_channels; c += kLanes) {
    const Lanes k = load(centre + c);
    Lanes first_even = {}, second_even = {}, first_odd = {}, second_odd = {};
    int64_t r = begin;
    for (; r + 1 < end; r += 2) {
      const int64_t at = r * channels + c;
      const Lanes x_even = load(x + at), x_odd = load(x + at + channels);
      const Lanes d_even = x_even - k;
      const Lanes d_odd = x_odd - k;
      const Lanes w_even = weight_at(at, c, x_even, d_even);
      const Lanes w_odd = weight_at(at + channels, c, x_odd, d_odd);
      first_even += w_even;
      second_even += w_even * d_even;
      first_odd += w_odd;
      second_odd += w_odd * d_odd;
    }
    if (r < end) {
      const int64_t at = r * channels + c;
      const Lanes x_lanes = load(x + at);
      const Lanes d = x_lanes - k;
      const Lanes weight = weight_at(at, c, x_lanes, d);
      first_even += weight;
      second_even += weight * d;
    }
    store(first + c, first_even + first_odd);
    store(second + c, second_even + second_odd);
  }
  for (int c = vector_channels; c < channels; ++c) {
    float first_sum = 0.0f, second_sum = 0.0f;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t at = r * channels + c;
      const float d = x[at] - centre[c];
      const float weight = kWeighted ? masked_dy<kMask>(dy[at], x[at], at, c, mask) : d;
      first_sum += weight;
      second_sum += weight * d;
    }
    first[c] = first_sum;
    second[c] = second_sum;
  }
}

// sum_centred_chunk over every row: chunks run in parallel and their float sums are added in
// chunk order into first[C] and second[C] (double), the same for any thread count.
template <bool kWeighted, BatchNormMask kMask>
void sum_centred(const float* x, const float* dy, const MaskSource& mask, const float* centre,
                 int64_t rows, int channels, std::vector<float>& chunk_sums, double* first,
                 double* second) {
  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  chunk_sums.resize(static_cast<size_t>(chunks) * 2 * channels);
  float* partials = chunk_sums.data();
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    float* sums = partials + chunk * 2 * channels;
    sum_centred_chunk<kWeighted, kMask>(x, dy, mask, centre, chunk * kRowsPerChunk,
                                        std::min(rows, (chunk + 1) * kRowsPerChunk), channels, sums,
                                        sums + channels);
  }
  std::fill(first, first + channels, 0.0);
  std::fill(second, second + channels, 0.0);
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const float* sums = partials + chunk * 2 * channels;
    for (int c = 0; c < channels; ++c) {
      first[c] += sums[c];
      second[c] += sums[channels + c];
    }
  }
}

// Stores of the elementwise pass: fp32, or the same value rounded once to bf16.
inline void store_out(float* out, Lanes v) {
  store(out, v);
}
// float_to_bf16 on 8 lanes at once (a loop over the lanes ran at half the fp32 pass's speed):
// round to nearest even, and a NaN stays a quiet NaN.
inline void store_out(bf16_bits* out, Lanes v) {
  typedef uint32_t Bits __attribute__((vector_size(kLanes * sizeof(uint32_t))));
  typedef uint16_t Half __attribute__((vector_size(kLanes * sizeof(uint16_t))));
  Bits bits;
  std::memcpy(&bits, &v, sizeof bits);
  const Bits rounded = (bits + (0x7FFFu + ((bits >> 16) & 1u))) >> 16;
  const Bits nan = (bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) != 0u;
  const Bits result = nan ? ((bits >> 16) | 0x0040u) : rounded;
  const Half halves = __builtin_convertvector(result, Half);
  std::memcpy(out, &halves, sizeof halves);
}
inline void store_out(float* out, float v) {
  *out = v;
}
inline void store_out(bf16_bits* out, float v) {
  *out = float_to_bf16(v);
}

// out[r, c] = scale[c] * x[r, c] + shift[c], then max(., 0) when kRelu. Out is float or bf16.
template <bool kRelu, typename Out>
void scale_and_shift(Out* out, const float* x, const float* scale, const float* shift, int64_t rows,
                     int channels) {
  const int vector_channels = channels - channels % kLanes;
  const Lanes zero = {};
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = r * channels;
    for (int c = 0; c < vector_channels; c += kLanes) {
      store_out(out + row + c, batchnorm_scale_shift<kRelu>(load(scale + c), load(x + row + c),
                                                            load(shift + c), zero));
    }
    for (int c = vector_channels; c < channels; ++c)
      store_out(out + row + c, batchnorm_scale_shift<kRelu>(scale[c], x[row + c], shift[c], 0.0f));
  }
}

template <typename Out>
void scale_and_shift(Out* out, const float* x, const float* scale, const float* shift, int64_t rows,
                     int channels, BatchNormActivation activation) {
  if (activation == BatchNormActivation::kRelu)
    scale_and_shift<true>(out, x, scale, shift, rows, channels);
  else
    scale_and_shift<false>(out, x, scale, shift, rows, channels);
}

// dx[r, c] (+)= k_dy[c] * dz[r, c] + k_x[c] * (x[r, c] - mean[c]) + k_0[c]; `=` when kFresh.
// dz from dy by kMask.
template <bool kFresh, BatchNormMask kMask>
void add_input_gradient(float* dx, const float* x, const float* dy, const MaskSource& mask,
                        const float* mean, const float* k_dy, const float* k_x, const float* k_0,
                        int64_t rows, int channels) {
  const int vector_channels = channels - channels % kLanes;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = r * channels;
    for (int c = 0; c < vector_channels; c += kLanes) {
      const Lanes x_lanes = load(x + row + c);
      const Lanes centred = x_lanes - load(mean + c);
      const Lanes dz = masked_dy<kMask>(load(dy + row + c), x_lanes, row + c, c, mask);
      const Lanes gradient =
          batchnorm_input_gradient(load(k_dy + c), dz, load(k_x + c), centred, load(k_0 + c));
      store(dx + row + c, kFresh ? gradient : load(dx + row + c) + gradient);
    }
    for (int c = vector_channels; c < channels; ++c) {
      const float dz = masked_dy<kMask>(dy[row + c], x[row + c], row + c, c, mask);
      const float gradient =
          batchnorm_input_gradient(k_dy[c], dz, k_x[c], x[row + c] - mean[c], k_0[c]);
      dx[row + c] = kFresh ? gradient : dx[row + c] + gradient;
    }
  }
}

template <BatchNormMask kMask>
void add_input_gradient(float* dx, const float* x, const float* dy, const MaskSource& mask,
                        const float* mean, const float* k_dy, const float* k_x, const float* k_0,
                        int64_t rows, int channels, bool fresh) {
  if (fresh)
    add_input_gradient<true, kMask>(dx, x, dy, mask, mean, k_dy, k_x, k_0, rows, channels);
  else
    add_input_gradient<false, kMask>(dx, x, dy, mask, mean, k_dy, k_x, k_0, rows, channels);
}

}  // namespace

// z = scale x + shift with scale = gamma invstd and shift = beta - mean scale: forward's
// normalisation, and backward's recomputed ReLU mask, from one expression.
void normalisation_coefficients(float* scale, float* shift, const float* gamma, const float* beta,
                                const float* mean, const float* invstd, int channels) {
  for (int c = 0; c < channels; ++c) scale[c] = gamma[c] * invstd[c];
  for (int c = 0; c < channels; ++c) shift[c] = beta[c] - mean[c] * scale[c];
}

void batchnorm_train_statistics(float* saved_mean, float* saved_invstd, float* running_mean,
                                float* running_var, const float* x, const float* gamma,
                                const float* beta, int64_t rows, int channels, float momentum,
                                float eps, BatchNormScratch& scratch) {
  scratch.sums.resize(2 * static_cast<size_t>(channels));
  scratch.coefficients.resize(3 * static_cast<size_t>(channels));
  float* scale = scratch.coefficients.data();
  float* shift = scale + channels;
  // One pass of sums of (x - k) and (x - k)^2 with k = the channel's first value: the variance
  // S2/M - (S1/M)^2 then cancels only (mean - k)^2, which is small when k is a typical value,
  // where E[x^2] - E[x]^2 loses everything once |mean| >> std.
  const float* offset = x;  // row 0
  double* sum = scratch.sums.data();
  double* squares = sum + channels;
  sum_centred<false, BatchNormMask::kNone>(x, nullptr, MaskSource{}, offset, rows, channels,
                                           scratch.chunk_sums, sum, squares);
  const double count = static_cast<double>(rows);
  for (int c = 0; c < channels; ++c) {
    const BatchNormChannelStatistics stats =
        batchnorm_channel_statistics(sum[c], squares[c], offset[c], count, eps);
    saved_mean[c] = stats.mean;
    saved_invstd[c] = stats.invstd;
    running_mean[c] = batchnorm_running_mean(running_mean[c], momentum, stats.mean);
    running_var[c] = batchnorm_running_var(running_var[c], momentum, stats.batch_var, count);
  }
  normalisation_coefficients(scale, shift, gamma, beta, saved_mean, saved_invstd, channels);
}

void batchnorm_forward_train(float* y, float* saved_mean, float* saved_invstd, float* running_mean,
                             float* running_var, const float* x, const float* gamma,
                             const float* beta, int64_t rows, int channels, float momentum,
                             float eps, BatchNormActivation activation, BatchNormScratch& scratch) {
  batchnorm_train_statistics(saved_mean, saved_invstd, running_mean, running_var, x, gamma, beta,
                             rows, channels, momentum, eps, scratch);
  const float* scale = scratch.coefficients.data();
  scale_and_shift(y, x, scale, scale + channels, rows, channels, activation);
}

void batchnorm_forward_train(bf16_bits* y, float* saved_mean, float* saved_invstd,
                             float* running_mean, float* running_var, const float* x,
                             const float* gamma, const float* beta, int64_t rows, int channels,
                             float momentum, float eps, BatchNormActivation activation,
                             BatchNormScratch& scratch) {
  batchnorm_train_statistics(saved_mean, saved_invstd, running_mean, running_var, x, gamma, beta,
                             rows, channels, momentum, eps, scratch);
  const float* scale = scratch.coefficients.data();
  scale_and_shift(y, x, scale, scale + channels, rows, channels, activation);
}

namespace {

// The MaskSource of `mask`: y, or forward's {scale, shift} recomputed into scratch.
MaskSource mask_source(BatchNormMask mask, const float* relu_output, const float* gamma,
                       const float* beta, const float* saved_mean, const float* saved_invstd,
                       int channels, BatchNormScratch& scratch) {
  MaskSource source;
  if (mask == BatchNormMask::kReluOutput) {
    FT_CHECK(relu_output != nullptr, "batchnorm: kReluOutput needs the ReLU's output");
    source.y = relu_output;
  } else if (mask == BatchNormMask::kRecomputed) {
    FT_CHECK(beta != nullptr, "batchnorm: kRecomputed needs beta");
    scratch.mask_coefficients.resize(2 * static_cast<size_t>(channels));
    float* scale = scratch.mask_coefficients.data();
    normalisation_coefficients(scale, scale + channels, gamma, beta, saved_mean, saved_invstd,
                               channels);
    source.scale = scale;
    source.shift = scale + channels;
  }
  return source;
}

// Calls body(std::integral_constant<BatchNormMask, mask>{}), so one call site instantiates the
// loops for each mask.
template <typename Body>
void with_mask(BatchNormMask mask, Body body) {
  if (mask == BatchNormMask::kNone)
    body(std::integral_constant<BatchNormMask, BatchNormMask::kNone>{});
  else if (mask == BatchNormMask::kReluOutput)
    body(std::integral_constant<BatchNormMask, BatchNormMask::kReluOutput>{});
  else
    body(std::integral_constant<BatchNormMask, BatchNormMask::kRecomputed>{});
}

// batchnorm_backward_statistics with its mask already resolved to `source`.
void backward_statistics(float* dgamma, float* dbeta, const float* dy, BatchNormMask mask,
                         const MaskSource& source, const float* x, const float* gamma,
                         const float* saved_mean, const float* saved_invstd, int64_t rows,
                         int channels, BatchNormScratch& scratch) {
  scratch.sums.resize(2 * static_cast<size_t>(channels));
  scratch.coefficients.resize(3 * static_cast<size_t>(channels));
  double* sum_dz = scratch.sums.data();
  double* sum_dz_centred = sum_dz + channels;  // sum dz * (x - mean)
  // With a ReLU after the normalisation, y = relu(z) and z = gamma x_hat + beta, the chain rule
  // gives dz = dy * [z > 0] = dy * [y > 0]. Everything below is BatchNorm's backward with dz in
  // place of its output gradient; the mask is applied as each element is read, in both passes,
  // and dz is never stored. BatchNormReluOp recomputes z from x, which both passes read anyway,
  // rather than reading y: 2 of the 7 floats per element its backward would otherwise stream.
  with_mask(mask, [&](auto masked) {
    sum_centred<true, decltype(masked)::value>(x, dy, source, saved_mean, rows, channels,
                                               scratch.chunk_sums, sum_dz, sum_dz_centred);
  });

  // With x_hat = (x - mean) * invstd and z = gamma x_hat + beta, over the M values of a channel:
  //   dbeta  = sum dz,   dgamma = sum dz * x_hat
  //   dx     = gamma * invstd / M * (M dz - dbeta - x_hat * dgamma)
  // The last line is dz pushed through x_hat, minus its projection on the two directions that
  // the batch mean and variance remove (the constant vector and x_hat itself). Expanded per
  // channel it is dx = k_dy dz + k_x (x - mean) + k_0. Elements the ReLU cut off (dz = 0) still
  // get k_x (x - mean) + k_0: through the statistics every x moves every z.
  float* k_dy = scratch.coefficients.data();
  float* k_x = k_dy + channels;
  float* k_0 = k_x + channels;
  const double count = static_cast<double>(rows);
  for (int c = 0; c < channels; ++c) {
    const BatchNormBackwardCoefficients k = batchnorm_backward_coefficients(
        sum_dz[c], sum_dz_centred[c], gamma[c], saved_invstd[c], count);
    dbeta[c] += k.dbeta;
    dgamma[c] += k.dgamma;
    k_dy[c] = k.k_dy;
    k_x[c] = k.k_x;
    k_0[c] = k.k_0;
  }
}

}  // namespace

void batchnorm_backward_statistics(float* dgamma, float* dbeta, const float* dy, BatchNormMask mask,
                                   const float* relu_output, const float* x, const float* gamma,
                                   const float* beta, const float* saved_mean,
                                   const float* saved_invstd, int64_t rows, int channels,
                                   BatchNormScratch& scratch) {
  const MaskSource source =
      mask_source(mask, relu_output, gamma, beta, saved_mean, saved_invstd, channels, scratch);
  backward_statistics(dgamma, dbeta, dy, mask, source, x, gamma, saved_mean, saved_invstd, rows,
                      channels, scratch);
}

void batchnorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, BatchNormMask mask,
                        const float* relu_output, const float* x, const float* gamma,
                        const float* beta, const float* saved_mean, const float* saved_invstd,
                        int64_t rows, int channels, bool dx_fresh, BatchNormScratch& scratch) {
  const MaskSource source =
      mask_source(mask, relu_output, gamma, beta, saved_mean, saved_invstd, channels, scratch);
  backward_statistics(dgamma, dbeta, dy, mask, source, x, gamma, saved_mean, saved_invstd, rows,
                      channels, scratch);
  const float* k_dy = scratch.coefficients.data();
  const float* k_x = k_dy + channels;
  const float* k_0 = k_x + channels;
  with_mask(mask, [&](auto masked) {
    add_input_gradient<decltype(masked)::value>(dx, x, dy, source, saved_mean, k_dy, k_x, k_0, rows,
                                                channels, dx_fresh);
  });
}

void batchnorm_forward_inference(float* y, const float* x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, int64_t rows,
                                 int channels, float eps, BatchNormActivation activation,
                                 BatchNormScratch& scratch) {
  scratch.coefficients.resize(3 * static_cast<size_t>(channels));
  float* scale = scratch.coefficients.data();
  float* shift = scale + channels;
  for (int c = 0; c < channels; ++c) {
    scale[c] = batchnorm_inference_scale(gamma[c], running_var[c], eps);
    shift[c] = beta[c] - running_mean[c] * scale[c];
  }
  scale_and_shift(y, x, scale, shift, rows, channels, activation);
}

}  // namespace ft

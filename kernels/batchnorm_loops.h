// BatchNorm's CPU loops over NHWC [rows, C], generic over the two places a fused variant differs
// from plain BatchNorm, so plain BatchNorm (kernels/batchnorm.cpp) and fusion/'s ReLU variants
// (fusion/ops/batchnorm_relu_kernels.cpp) run the very same loops and expressions:
//   Output, what the elementwise pass stores: static V apply(V scale, V x, V shift), V = Lanes or
//     float (BatchNormPlainOutput: z = scale x + shift);
//   Dz, where backward's dz comes from: V operator()(V dy, V x, int64_t at, int c) const, dy and x
//     at element `at` of channel c (channels c..c+7 when V is Lanes; BatchNormPlainDz: dz = dy).
// A channel is every C-th float, so each row of C channels is a few 8-float vectors and the
// per-channel statistics are vectors of partial sums. Each direction reads the activations
// twice: once to reduce the statistics, once for the elementwise pass. Reductions sum a chunk of
// rows in float and the chunks in double, so large batches keep float precision.
// The loops use GCC/Clang vector extensions (Lanes) over blocks of 8 channels, with a scalar tail
// for channel counts that are not a multiple of 8. Written as plain per-row loops over C, GCC
// keeps the partial sums in memory: a reduction pass over [64, 28, 28, 16] took 0.28 ms instead
// of 0.07 ms (BM_BatchNormForwardBackward in bench/resnet_bench.cpp times the op).
// Every file that includes this header compiles with -ffp-contract=off (CMakeLists.txt), so each
// expression rounds the same in every variant and the fused ops match their unfused chains.
// Thread safety: loops are parallel over rows or row chunks with OpenMP; statistics are summed in
// a fixed chunk order, so results do not depend on the thread count.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/batchnorm.h"
#include "kernels/batchnorm_lanes.h"
#include "kernels/batchnorm_math.h"

namespace ft {

// Plain BatchNorm's elementwise pass: y = z = scale x + shift.
struct BatchNormPlainOutput {
  template <typename V>
  static V apply(V scale, V x, V shift) {
    return batchnorm_scale_shift(scale, x, shift);
  }
};

// Plain BatchNorm's backward: dz = dy.
struct BatchNormPlainDz {
  template <typename V>
  V operator()(V dy, V /*x*/, int64_t /*at*/, int /*c*/) const {
    return dy;
  }
};

namespace batchnorm_loops {

using batchnorm_lanes::kLanes;
using batchnorm_lanes::kRowsPerChunk;
using batchnorm_lanes::Lanes;
using batchnorm_lanes::load;
using batchnorm_lanes::store;

// Over rows [begin, end) of x, with d = x - centre[c] and w = d, or w = dz (kWeighted; dz from
// dy by dz_of): first[c] = sum w, second[c] = sum w * d. Two row accumulators per vector hide
// the add latency.
template <bool kWeighted, typename Dz>
void sum_centred_chunk(const float* x, const float* dy, const Dz& dz_of, const float* centre,
                       int64_t begin, int64_t end, int channels, float* first, float* second) {
  const int vector_channels = channels - channels % kLanes;
  auto weight_at = [&](int64_t at, int c, Lanes x_lanes, Lanes d) {
    if (!kWeighted) return d;
    return dz_of(load(dy + at), x_lanes, at, c);
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
      const float weight = kWeighted ? dz_of(dy[at], x[at], at, c) : d;
      first_sum += weight;
      second_sum += weight * d;
    }
    first[c] = first_sum;
    second[c] = second_sum;
  }
}

// sum_centred_chunk over every row: chunks run in parallel and their float sums are added in
// chunk order into first[C] and second[C] (double), the same for any thread count.
template <bool kWeighted, typename Dz>
void sum_centred(const float* x, const float* dy, const Dz& dz_of, const float* centre,
                 int64_t rows, int channels, std::vector<float>& chunk_sums, double* first,
                 double* second) {
  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  chunk_sums.resize(static_cast<size_t>(chunks) * 2 * channels);
  float* partials = chunk_sums.data();
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    float* sums = partials + chunk * 2 * channels;
    sum_centred_chunk<kWeighted>(x, dy, dz_of, centre, chunk * kRowsPerChunk,
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

// out[r, c] = Output::apply(scale[c], x[r, c], shift[c]). Out is float or bf16_bits.
template <typename Output, typename Out>
void scale_and_shift(Out* out, const float* x, const float* scale, const float* shift, int64_t rows,
                     int channels) {
  const int vector_channels = channels - channels % kLanes;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = r * channels;
    for (int c = 0; c < vector_channels; c += kLanes) {
      store_out(out + row + c, Output::apply(load(scale + c), load(x + row + c), load(shift + c)));
    }
    for (int c = vector_channels; c < channels; ++c)
      store_out(out + row + c, Output::apply(scale[c], x[row + c], shift[c]));
  }
}

// batchnorm_forward_train with Output's elementwise pass (see kernels/batchnorm.h).
template <typename Output, typename Out>
void forward_train(Out* y, float* saved_mean, float* saved_invstd, float* running_mean,
                   float* running_var, const float* x, const float* gamma, const float* beta,
                   int64_t rows, int channels, float momentum, float eps,
                   BatchNormScratch& scratch) {
  batchnorm_train_statistics(saved_mean, saved_invstd, running_mean, running_var, x, gamma, beta,
                             rows, channels, momentum, eps, scratch);
  const float* scale = scratch.coefficients.data();
  scale_and_shift<Output>(y, x, scale, scale + channels, rows, channels);
}

// batchnorm_forward_inference with Output's elementwise pass (see kernels/batchnorm.h).
template <typename Output>
void forward_inference(float* y, const float* x, const float* gamma, const float* beta,
                       const float* running_mean, const float* running_var, int64_t rows,
                       int channels, float eps, BatchNormScratch& scratch) {
  scratch.coefficients.resize(3 * static_cast<size_t>(channels));
  float* scale = scratch.coefficients.data();
  float* shift = scale + channels;
  for (int c = 0; c < channels; ++c) {
    scale[c] = batchnorm_inference_scale(gamma[c], running_var[c], eps);
    shift[c] = beta[c] - running_mean[c] * scale[c];
  }
  scale_and_shift<Output>(y, x, scale, shift, rows, channels);
}

// Backward's reduction pass with dz from dy by dz_of, then its per-channel step: adds to dgamma
// and dbeta and leaves {k_dy, k_x, k_0} [3][C] in scratch.coefficients, so that
// dx = k_dy dz + k_x (x - mean) + k_0.
template <typename Dz>
void backward_statistics(float* dgamma, float* dbeta, const float* dy, const Dz& dz_of,
                         const float* x, const float* gamma, const float* saved_mean,
                         const float* saved_invstd, int64_t rows, int channels,
                         BatchNormScratch& scratch) {
  scratch.sums.resize(2 * static_cast<size_t>(channels));
  scratch.coefficients.resize(3 * static_cast<size_t>(channels));
  double* sum_dz = scratch.sums.data();
  double* sum_dz_centred = sum_dz + channels;  // sum dz * (x - mean)
  // dz is formed as each element is read, in both passes, and never stored: a fused ReLU's mask
  // (fusion/ops/batchnorm_relu_kernels.cpp) costs no pass of its own.
  sum_centred<true>(x, dy, dz_of, saved_mean, rows, channels, scratch.chunk_sums, sum_dz,
                    sum_dz_centred);

  // With x_hat = (x - mean) * invstd and z = gamma x_hat + beta, over the M values of a channel:
  //   dbeta  = sum dz,   dgamma = sum dz * x_hat
  //   dx     = gamma * invstd / M * (M dz - dbeta - x_hat * dgamma)
  // The last line is dz pushed through x_hat, minus its projection on the two directions that
  // the batch mean and variance remove (the constant vector and x_hat itself). Expanded per
  // channel it is dx = k_dy dz + k_x (x - mean) + k_0. Elements a ReLU cut off (dz = 0) still
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

// dx[r, c] (+)= k_dy[c] * dz[r, c] + k_x[c] * (x[r, c] - mean[c]) + k_0[c]; `=` when kFresh.
// dz from dy by dz_of.
template <bool kFresh, typename Dz>
void add_input_gradient(float* dx, const float* x, const float* dy, const Dz& dz_of,
                        const float* mean, const float* k_dy, const float* k_x, const float* k_0,
                        int64_t rows, int channels) {
  const int vector_channels = channels - channels % kLanes;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = r * channels;
    for (int c = 0; c < vector_channels; c += kLanes) {
      const Lanes x_lanes = load(x + row + c);
      const Lanes centred = x_lanes - load(mean + c);
      const Lanes dz = dz_of(load(dy + row + c), x_lanes, row + c, c);
      const Lanes gradient =
          batchnorm_input_gradient(load(k_dy + c), dz, load(k_x + c), centred, load(k_0 + c));
      store(dx + row + c, kFresh ? gradient : load(dx + row + c) + gradient);
    }
    for (int c = vector_channels; c < channels; ++c) {
      const float dz = dz_of(dy[row + c], x[row + c], row + c, c);
      const float gradient =
          batchnorm_input_gradient(k_dy[c], dz, k_x[c], x[row + c] - mean[c], k_0[c]);
      dx[row + c] = kFresh ? gradient : dx[row + c] + gradient;
    }
  }
}

// batchnorm_backward with dz from dy by dz_of: backward_statistics, then the input gradient.
template <typename Dz>
void backward(float* dx, float* dgamma, float* dbeta, const float* dy, const Dz& dz_of,
              const float* x, const float* gamma, const float* saved_mean,
              const float* saved_invstd, int64_t rows, int channels, bool dx_fresh,
              BatchNormScratch& scratch) {
  backward_statistics(dgamma, dbeta, dy, dz_of, x, gamma, saved_mean, saved_invstd, rows, channels,
                      scratch);
  const float* k_dy = scratch.coefficients.data();
  const float* k_x = k_dy + channels;
  const float* k_0 = k_x + channels;
  if (dx_fresh)
    add_input_gradient<true>(dx, x, dy, dz_of, saved_mean, k_dy, k_x, k_0, rows, channels);
  else
    add_input_gradient<false>(dx, x, dy, dz_of, saved_mean, k_dy, k_x, k_0, rows, channels);
}

}  // namespace batchnorm_loops
}  // namespace ft

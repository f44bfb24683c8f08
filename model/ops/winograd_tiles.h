// The 1-D transforms of the two Winograd variants, F(2, 3) and F(4, 3) (Lavin and Gray 2015,
// points 0, +-1 and 0, +-1, +-2, infinity). A 2-D transform applies the 1-D one to every column,
// then to every row. Each takes T = float or a Vec (8 or 16 channels, or kernels), and
// spells its matrix out as adds and scalings, since a general matrix product would multiply by
// the zeros too (the compiler may not drop x * 0 under IEEE rules).
//   input   B^T z   (window -> points)      the input tile
//   output  A^T z   (points -> out)         the products back to outputs
//   grad    A z     (out -> points)         an output-gradient tile, for the weight gradient
//   kernel  G g     (3 -> points)           the 3x3 kernel
//   kernel_grad  G^T u  (points -> 3)       back from the transformed kernel gradient
// Internal to model/ops/winograd.cpp and model/ops/winograd_avx512.cpp; not a public header.
// Everything here has internal linkage (the unnamed namespace): the two files compile it with
// different instruction sets, and the linker must never pick one file's copy for the other.
#pragma once

namespace ft::winograd {
namespace {

// L floats, one AVX2 (8) or AVX-512 (16) register; aligned(4) lets it load and store at any
// float address.
template <int L>
struct Lanes;
template <>
struct Lanes<8> {
  typedef float Vec __attribute__((vector_size(32), aligned(4)));
};
template <>
struct Lanes<16> {
  typedef float Vec __attribute__((vector_size(64), aligned(4)));
};
template <int L>
using Vec = typename Lanes<L>::Vec;

template <int L>
inline Vec<L> load(const float* at) {
  return *reinterpret_cast<const Vec<L>*>(at);
}
template <int L>
inline void store(float* at, Vec<L> value) {
  *reinterpret_cast<Vec<L>*>(at) = value;
}

using Vec8 = Vec<8>;
inline Vec8 load8(const float* at) {
  return load<8>(at);
}
inline void store8(float* at, Vec8 value) {
  store<8>(at, value);
}

// F(2x2, 3x3): 4x4 windows, 2x2 outputs, 16 points. Coefficients 0, +-1, +-1/2: exact enough to
// match direct convolution to float rounding.
struct F2 {
  static constexpr int kOut = 2, kWindow = 4, kPoints = 16;
  // B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]
  template <typename T>
  static void input(const T* z, T* out) {
    out[0] = z[0] - z[2];
    out[1] = z[1] + z[2];
    out[2] = z[2] - z[1];
    out[3] = z[1] - z[3];
  }
  // A^T = [1 1 1 0; 0 1 -1 -1]
  template <typename T>
  static void output(const T* z, T* out) {
    out[0] = z[0] + z[1] + z[2];
    out[1] = z[1] - z[2] - z[3];
  }
  template <typename T>
  static void grad(const T* z, T* out) {
    out[0] = z[0];
    out[1] = z[0] + z[1];
    out[2] = z[0] - z[1];
    out[3] = -z[1];
  }
  // G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]
  template <typename T>
  static void kernel(const T* g, T* out) {
    out[0] = g[0];
    out[1] = 0.5f * (g[0] + g[1] + g[2]);
    out[2] = 0.5f * (g[0] - g[1] + g[2]);
    out[3] = g[2];
  }
  template <typename T>
  static void kernel_grad(const T* u, T* out) {
    out[0] = u[0] + 0.5f * (u[1] + u[2]);
    out[1] = 0.5f * (u[1] - u[2]);
    out[2] = 0.5f * (u[1] + u[2]) + u[3];
  }
};

// F(4x4, 3x3): 6x6 windows, 4x4 outputs, 36 points: 36 multiplies per 16 outputs against F2's 64,
// at about the same transform cost per output. Larger coefficients cost some float accuracy
// (relative errors near 1e-6 instead of 1e-7 at ResNet's sizes; tests/resnet_winograd_test.cpp).
struct F4 {
  static constexpr int kOut = 4, kWindow = 6, kPoints = 36;
  // B^T = [4  0 -5  0 1 0;
  //        0 -4 -4  1 1 0;
  //        0  4 -4 -1 1 0;
  //        0 -2 -1  2 1 0;
  //        0  2 -1 -2 1 0;
  //        0  4  0 -5 0 1]
  template <typename T>
  static void input(const T* z, T* out) {
    const T four_apart = z[4] - 4.0f * z[2], minus_four = z[3] - 4.0f * z[1];
    const T one_apart = z[4] - z[2], twice = 2.0f * (z[3] - z[1]);
    out[0] = 4.0f * z[0] - 5.0f * z[2] + z[4];
    out[1] = four_apart + minus_four;
    out[2] = four_apart - minus_four;
    out[3] = one_apart + twice;
    out[4] = one_apart - twice;
    out[5] = 4.0f * z[1] - 5.0f * z[3] + z[5];
  }
  // A^T = [1 1  1 1  1 0;
  //        0 1 -1 2 -2 0;
  //        0 1  1 4  4 0;
  //        0 1 -1 8 -8 1]
  template <typename T>
  static void output(const T* z, T* out) {
    const T sum12 = z[1] + z[2], diff12 = z[1] - z[2];
    const T sum34 = z[3] + z[4], diff34 = z[3] - z[4];
    out[0] = z[0] + sum12 + sum34;
    out[1] = diff12 + 2.0f * diff34;
    out[2] = sum12 + 4.0f * sum34;
    out[3] = diff12 + 8.0f * diff34 + z[5];
  }
  template <typename T>
  static void grad(const T* z, T* out) {
    const T even = z[0] + z[2], odd = z[1] + z[3];
    const T even4 = z[0] + 4.0f * z[2], odd8 = 2.0f * z[1] + 8.0f * z[3];
    out[0] = z[0];
    out[1] = even + odd;
    out[2] = even - odd;
    out[3] = even4 + odd8;
    out[4] = even4 - odd8;
    out[5] = z[3];
  }
  // G = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1]
  // Multiplies by rounded reciprocals: a division per coefficient made the weight transforms 5% of
  // a resnet20 step.
  static constexpr float kSixth = 1.0f / 6.0f, kTwelfth = 1.0f / 12.0f,
                         kTwentyFourth = 1.0f / 24.0f;
  template <typename T>
  static void kernel(const T* g, T* out) {
    out[0] = 0.25f * g[0];
    out[1] = -kSixth * (g[0] + g[1] + g[2]);
    out[2] = -kSixth * (g[0] - g[1] + g[2]);
    out[3] = kTwentyFourth * g[0] + kTwelfth * g[1] + kSixth * g[2];
    out[4] = kTwentyFourth * g[0] - kTwelfth * g[1] + kSixth * g[2];
    out[5] = g[2];
  }
  template <typename T>
  static void kernel_grad(const T* u, T* out) {
    out[0] = 0.25f * u[0] - kSixth * (u[1] + u[2]) + kTwentyFourth * (u[3] + u[4]);
    out[1] = kSixth * (u[2] - u[1]) + kTwelfth * (u[3] - u[4]);
    out[2] = kSixth * (u[3] + u[4] - u[1] - u[2]) + u[5];
  }
};

}  // namespace
}  // namespace ft::winograd

// Tests for FlashAttentionOp's bf16 tile paths: the AVX512-BF16 kernels (flash_attention_bf16.h,
// skipped where the CPU lacks them) and the widening path of every other CPU (fp32 tiles with
// TileRounding::kBf16), forward and backward, against a double reference that rounds exactly
// what both paths round (P, dS and dY to bf16, nearest even) on bf16 q, k, v; and the two paths
// against each other where tiles split the rows. Shapes: head dims 32, 64, 20 and 33 (padded
// inside the tiles), seq_len not a multiple of the tile, odd tiles.
#include "fusion/ops/flash_attention_bf16.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/math/bf16_math.h"
#include "core/rng.h"
#include "fusion/ops/flash_attention.h"

namespace ft {
namespace {

struct Shape {
  int B, T, C, NH, tile;
};

struct Inputs {
  std::vector<bf16_bits> q, k, v;
  std::vector<float> q_wide, k_wide, v_wide, dy;
};

Inputs make_inputs(const Shape& s, uint64_t seed) {
  Rng rng(seed);
  const size_t n = static_cast<size_t>(s.B) * s.T * s.C;
  Inputs in;
  for (auto [bits, wide] : {std::pair{&in.q, &in.q_wide}, {&in.k, &in.k_wide}, {&in.v, &in.v_wide}})
    for (size_t i = 0; i < n; ++i) {
      bits->push_back(float_to_bf16(4.0f * rng.uniform() - 2.0f));
      wide->push_back(bf16_to_float(bits->back()));
    }
  for (size_t i = 0; i < n; ++i) in.dy.push_back(2.0f * rng.uniform() - 1.0f);
  return in;
}

struct Result {
  std::vector<float> y, lse, dq, dk, dv;
};

enum class Path { kBf16Instructions, kWidened };

Result run(Path path, const Shape& s, const Inputs& in) {
  const size_t n = in.dy.size();
  Result r{std::vector<float>(n), std::vector<float>(static_cast<size_t>(s.B) * s.NH * s.T),
           std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
  const AttentionStrides strides{s.C, s.C, s.C, s.C};
  if (path == Path::kBf16Instructions) {
    flash_attention_forward_bf16(r.y.data(), r.lse.data(), in.q.data(), in.k.data(), in.v.data(),
                                 strides, s.B, s.T, s.C, s.NH, s.tile);
    flash_attention_backward_bf16(r.dq.data(), r.dk.data(), r.dv.data(), in.dy.data(), r.y.data(),
                                  r.lse.data(), in.q.data(), in.k.data(), in.v.data(), strides, s.B,
                                  s.T, s.C, s.NH, s.tile);
  } else {
    flash_attention_forward(r.y.data(), r.lse.data(), in.q_wide.data(), in.k_wide.data(),
                            in.v_wide.data(), strides, s.B, s.T, s.C, s.NH, s.tile,
                            TileRounding::kBf16);
    flash_attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), in.dy.data(), r.y.data(),
                             r.lse.data(), in.q_wide.data(), in.k_wide.data(), in.v_wide.data(),
                             strides, s.B, s.T, s.C, s.NH, s.tile, TileRounding::kBf16);
  }
  return r;
}

float rounded(double value) {
  return round_to_bf16(static_cast<float>(value));
}

// Causal attention in double on the bf16 values, rounding where the kernels round. With one key
// tile per row (tile >= T) the forward's unnormalised weights exp(S - m) use the row's true max,
// as here.
Result reference(const Shape& s, const Inputs& in) {
  const int T = s.T, C = s.C, hd = C / s.NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const size_t n = in.dy.size();
  Result r{std::vector<float>(n), std::vector<float>(static_cast<size_t>(s.B) * s.NH * T),
           std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
  auto at = [&](int b, int t, int h) { return (static_cast<size_t>(b) * T + t) * C + h * hd; };
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h) {
      std::vector<double> S(static_cast<size_t>(T) * T), P(S.size()), L(T), D(T);
      for (int t = 0; t < T; ++t) {
        double m = -INFINITY, l = 0;
        for (int u = 0; u <= t; ++u) {
          double dot = 0;
          for (int d = 0; d < hd; ++d)
            dot += in.q_wide[at(b, t, h) + d] * in.k_wide[at(b, u, h) + d];
          S[t * T + u] = scale * dot;
          m = std::max(m, S[t * T + u]);
        }
        std::vector<double> y(hd, 0.0);
        for (int u = 0; u <= t; ++u) {
          const double w = std::exp(S[t * T + u] - m);
          l += w;
          for (int d = 0; d < hd; ++d) y[d] += rounded(w) * in.v_wide[at(b, u, h) + d];
        }
        L[t] = m + std::log(l);
        for (int d = 0; d < hd; ++d) r.y[at(b, t, h) + d] = static_cast<float>(y[d] / l);
        r.lse[(static_cast<size_t>(b) * s.NH + h) * T + t] = static_cast<float>(L[t]);
      }
      // dV += round(P)^T dY', dS = P (dY' V^T - D), dQ += scale round(dS) K, dK += scale
      // round(dS)^T Q, with dY' = round(dY) and D_t = <dY'_t, Y_t>.
      for (int t = 0; t < T; ++t) {
        D[t] = 0;
        for (int d = 0; d < hd; ++d) D[t] += rounded(in.dy[at(b, t, h) + d]) * r.y[at(b, t, h) + d];
        for (int u = 0; u <= t; ++u) {
          const double p = std::exp(S[t * T + u] - L[t]);
          double dp = 0;
          for (int d = 0; d < hd; ++d)
            dp += rounded(in.dy[at(b, t, h) + d]) * in.v_wide[at(b, u, h) + d];
          const double ds = rounded(p * (dp - D[t]));
          for (int d = 0; d < hd; ++d) {
            r.dv[at(b, u, h) + d] += rounded(p) * rounded(in.dy[at(b, t, h) + d]);
            r.dq[at(b, t, h) + d] += scale * ds * in.k_wide[at(b, u, h) + d];
            r.dk[at(b, u, h) + d] += scale * ds * in.q_wide[at(b, t, h) + d];
          }
        }
      }
    }
  return r;
}

// Largest |a - b| over the largest |b|.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double error = 0, largest = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    error = std::max(error, std::abs(static_cast<double>(a[i]) - b[i]));
    largest = std::max(largest, std::abs(static_cast<double>(b[i])));
  }
  return error / largest;
}

void expect_close(const Result& got, const Result& want, double tolerance) {
  EXPECT_LT(relative_error(got.y, want.y), tolerance) << "y";
  EXPECT_LT(relative_error(got.lse, want.lse), tolerance) << "lse";
  EXPECT_LT(relative_error(got.dq, want.dq), tolerance) << "dq";
  EXPECT_LT(relative_error(got.dk, want.dk), tolerance) << "dk";
  EXPECT_LT(relative_error(got.dv, want.dv), tolerance) << "dv";
}

// hd 32 (gpt_small), 64, 20 and 33 (padded to a vector); seq_len not a multiple of 16 or 2. Head
// dims of whole vectors (32, 64, 96) transpose K and V 16 x 16 words at a time, 96 in three
// column blocks and over rows that fill whole blocks; 20 and 33 take the scalar packing.
const Shape kSingleTile[] = {{2, 37, 64, 2, 64},
                             {1, 50, 128, 2, 64},
                             {2, 33, 40, 2, 40},
                             {1, 45, 66, 2, 64},
                             {1, 32, 192, 2, 32}};

void check_against_reference(Path path) {
  for (const Shape& s : kSingleTile) {
    SCOPED_TRACE("T=" + std::to_string(s.T) + " hd=" + std::to_string(s.C / s.NH));
    const Inputs in = make_inputs(s, 7 + s.T);
    // Same roundings on the same values: what is left is fp32 accumulation order (~1e-6 of the
    // largest value) and, rarely, a rounded P or dS one bf16 step (2^-8 of that term) apart where
    // fast_exp and std::exp fall on two sides of a rounding boundary.
    expect_close(run(path, s, in), reference(s, in), 5e-4);
  }
}

TEST(FlashAttentionBf16Test, Bf16InstructionsMatchTheRoundedReference) {
  if (!flash_attention_bf16_native()) GTEST_SKIP() << "no AVX512-BF16 here (or capped by oneDNN)";
  check_against_reference(Path::kBf16Instructions);
}

TEST(FlashAttentionBf16Test, WidenedPathMatchesTheRoundedReference) {
  check_against_reference(Path::kWidened);
}

TEST(FlashAttentionBf16Test, BothPathsAgreeAcrossTiles) {
  if (!flash_attention_bf16_native()) GTEST_SKIP() << "no AVX512-BF16 here (or capped by oneDNN)";
  // Even tiles split rows alike on both paths; an odd one (7) is rounded up to 8 by the bf16
  // kernels, so their running maxima, hence the rounded unnormalised weights, differ by up to a
  // bf16 step per weight: the tolerance of the eager twin's bf16 against fp32 (1e-2) would do,
  // these agree far closer.
  const Shape shapes[] = {
      {2, 50, 64, 2, 16}, {1, 70, 128, 2, 16}, {1, 41, 66, 2, 12}, {2, 29, 64, 2, 7}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE("T=" + std::to_string(s.T) + " tile=" + std::to_string(s.tile));
    const Inputs in = make_inputs(s, 11 + s.T);
    expect_close(run(Path::kBf16Instructions, s, in), run(Path::kWidened, s, in),
                 s.tile % 2 ? 5e-3 : 2e-4);
  }
}

// The gradient of one [B*T, 3C] buffer (QkvLinearOp's layout: dq, dk, dv its column blocks), 64
// bytes aligned as the executor's arena hands it out, every element `fill`; backward on q, k, v
// viewed the same way in one bf16 buffer, overwriting the gradients `writes` names.
std::vector<float> qkv_layout_backward(const Shape& s, const Inputs& in,
                                       const AttentionGradWrites& writes, float fill) {
  const size_t rows = static_cast<size_t>(s.B) * s.T, width = 3 * static_cast<size_t>(s.C);
  std::vector<bf16_bits> qkv(rows * width);
  for (size_t r = 0; r < rows; ++r)
    for (int c = 0; c < s.C; ++c) {
      qkv[r * width + c] = in.q[r * s.C + c];
      qkv[r * width + s.C + c] = in.k[r * s.C + c];
      qkv[r * width + 2 * s.C + c] = in.v[r * s.C + c];
    }
  const AttentionStrides strides{static_cast<int64_t>(width), static_cast<int64_t>(width),
                                 static_cast<int64_t>(width), s.C};
  std::vector<float> y(rows * s.C), lse(static_cast<size_t>(s.B) * s.NH * s.T);
  flash_attention_forward_bf16(y.data(), lse.data(), qkv.data(), qkv.data() + s.C,
                               qkv.data() + 2 * s.C, strides, s.B, s.T, s.C, s.NH, s.tile);
  std::vector<float> storage(rows * width + 16, fill);
  const size_t misalignment = reinterpret_cast<uintptr_t>(storage.data()) % 64 / sizeof(float);
  float* grad = storage.data() + (misalignment == 0 ? 0 : 16 - misalignment);
  flash_attention_backward_bf16(grad, grad + s.C, grad + 2 * s.C, in.dy.data(), y.data(),
                                lse.data(), qkv.data(), qkv.data() + s.C, qkv.data() + 2 * s.C,
                                strides, s.B, s.T, s.C, s.NH, s.tile, writes);
  return std::vector<float>(grad, grad + rows * width);
}

// Overwriting a gradient poisoned with NaN gives exactly what adding into zeros gives, on whole
// vectors of a head (hd 32: the streamed rows, one and several key tiles) and padded ones (hd 20);
// a gradient not named is still added into.
TEST(FlashAttentionBf16Test, OverwritingWritesWhatAddingIntoZerosGives) {
  if (!flash_attention_bf16_native()) GTEST_SKIP() << "no AVX512-BF16 here (or capped by oneDNN)";
  const Shape shapes[] = {{2, 48, 64, 2, 64}, {1, 50, 64, 2, 16}, {2, 37, 40, 2, 40}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE("T=" + std::to_string(s.T) + " hd=" + std::to_string(s.C / s.NH));
    const Inputs in = make_inputs(s, 3 + s.T);
    const std::vector<float> added = qkv_layout_backward(s, in, {}, 0.0f);
    const std::vector<float> written = qkv_layout_backward(s, in, {true, true, true}, NAN);
    // dk added into ones: each element one more than the sum alone, to an fp32 rounding or two
    // (the add may be fused with the scale's product).
    const std::vector<float> mixed = qkv_layout_backward(s, in, {true, false, true}, 1.0f);
    size_t differing = 0, mixed_off = 0;
    for (size_t i = 0; i < added.size(); ++i) {
      differing += !(written[i] == added[i]);
      const bool dk = i % (3 * s.C) / s.C == 1;
      const float want = dk ? added[i] + 1.0f : added[i];
      mixed_off += !(std::abs(mixed[i] - want) <= 1e-6f * std::max(1.0f, std::abs(want)));
    }
    EXPECT_EQ(differing, 0u);
    EXPECT_EQ(mixed_off, 0u);
  }
}

// A bf16 y (fusion.vertical.cast): forward rounds exactly the fp32 y it would write (the direct
// store from the registers where one key tile holds every key, the row pass otherwise), and
// backward on the bf16 y equals backward on that y widened to fp32 bit for bit, as D = <dY, Y>
// then reads the same values.
TEST(FlashAttentionBf16Test, Bf16OutputIsTheFp32OutputRounded) {
  if (!flash_attention_bf16_native()) GTEST_SKIP() << "no AVX512-BF16 here (or capped by oneDNN)";
  const Shape shapes[] = {{2, 48, 64, 2, 64}, {1, 50, 64, 2, 16}, {2, 37, 40, 2, 40}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE("T=" + std::to_string(s.T) + " tile=" + std::to_string(s.tile));
    const Inputs in = make_inputs(s, 5 + s.T);
    const size_t n = in.dy.size(), lse_count = static_cast<size_t>(s.B) * s.NH * s.T;
    const AttentionStrides strides{s.C, s.C, s.C, s.C};
    std::vector<float> y(n), lse(lse_count), lse_bf16(lse_count);
    std::vector<bf16_bits> y_bf16(n);
    flash_attention_forward_bf16(y.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(),
                                 strides, s.B, s.T, s.C, s.NH, s.tile);
    flash_attention_forward_bf16(y_bf16.data(), lse_bf16.data(), in.q.data(), in.k.data(),
                                 in.v.data(), strides, s.B, s.T, s.C, s.NH, s.tile);
    EXPECT_EQ(lse_bf16, lse);
    std::vector<float> y_widened(n);
    size_t misrounded = 0;
    for (size_t i = 0; i < n; ++i) {
      misrounded += y_bf16[i] != float_to_bf16(y[i]);
      y_widened[i] = bf16_to_float(y_bf16[i]);
    }
    EXPECT_EQ(misrounded, 0u);
    std::vector<float> grads[2];
    for (int from_bf16 = 0; from_bf16 < 2; ++from_bf16) {
      std::vector<float>& g = grads[from_bf16];
      g.assign(3 * n, 0.0f);
      if (from_bf16)
        flash_attention_backward_bf16(g.data(), g.data() + n, g.data() + 2 * n, in.dy.data(),
                                      y_bf16.data(), lse.data(), in.q.data(), in.k.data(),
                                      in.v.data(), strides, s.B, s.T, s.C, s.NH, s.tile);
      else
        flash_attention_backward_bf16(g.data(), g.data() + n, g.data() + 2 * n, in.dy.data(),
                                      y_widened.data(), lse.data(), in.q.data(), in.k.data(),
                                      in.v.data(), strides, s.B, s.T, s.C, s.NH, s.tile);
    }
    EXPECT_EQ(grads[1], grads[0]);
  }
}

}  // namespace
}  // namespace ft

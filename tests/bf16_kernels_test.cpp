// Mixed precision's building blocks on the CPU: the bf16 rounding, the bf16 GEMM against the
// fp32 GEMM on bf16-rounded operands (the reference: the same values, fp32 products), and the
// cast op. ctest runs this binary twice: as is (oneDNN's bf16 kernels where the CPU has them)
// and with ONEDNN_MAX_CPU_ISA=AVX2 (the widening path every CPU without bf16 takes), so both
// paths are checked on a bf16-capable machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "core/bf16_cast.h"
#include "core/check.h"
#include "core/gemm.h"
#include "core/math/bf16_math.h"
#include "gemm_test_util.h"
#include "model/ops/attention_mix.h"
#include "model/ops/attention_scores.h"
#include "model/ops/cast.h"

namespace ft {
namespace {

TEST(Bf16Rounding, NearestWithTiesToEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  // 1 + 2^-8 lies exactly halfway between 1 and 1 + 2^-7: the tie goes to the even mantissa (1).
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to the even one.
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  // Just above the tie rounds up.
  EXPECT_EQ(float_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3F81);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(bf16_to_float(0x3F81), 1.0f + std::ldexp(1.0f, -7));
}

TEST(Bf16Rounding, SpecialValues) {
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload sits only in the dropped bits must stay a NaN, not become infinity.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(float_from_bits(0x7F800001u)))));
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::max()),
            std::numeric_limits<float>::infinity());  // overflow rounds to infinity
  EXPECT_EQ(round_to_bf16(0.0f), 0.0f);
}

TEST(Bf16Cast, ArraysRoundEveryElementAlike) {
  const std::vector<float> values = gemm_test::uniform(100003, -50, 50, 3);
  std::vector<bf16_bits> rounded(values.size());
  cast_to_bf16(rounded.data(), values.data(), static_cast<int64_t>(values.size()));
  std::vector<float> widened(values.size());
  cast_to_float(widened.data(), rounded.data(), static_cast<int64_t>(values.size()));
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(rounded[i], float_to_bf16(values[i])) << i;
    ASSERT_EQ(widened[i], round_to_bf16(values[i])) << i;
  }
}

struct Bf16GemmCase {
  GemmArgs args;
  const char* name;
};

using gemm_test::rounded;
using gemm_test::to_bf16;

class Bf16Gemm : public testing::TestWithParam<Bf16GemmCase> {};

// The bf16 GEMM equals the fp32 GEMM of the same bf16-rounded operands up to fp32 accumulation
// order: |difference| <= 1e-5 * (k * max|a| * max|b| + |c|), products of bf16 values being exact
// in fp32.
TEST_P(Bf16Gemm, MatchesFp32OnRoundedOperands) {
  const GemmArgs args = GetParam().args;
  gemm_test::GemmBuffers buffers = gemm_test::make_gemm_buffers(args, 11);
  GemmArgs bf16_args = args, fp32_args = args;
  std::vector<float> c_bf16 = buffers.c, c_fp32 = buffers.c;
  std::vector<float> aux_bf16 = buffers.aux, aux_fp32 = buffers.aux;
  std::vector<float> bias_grad_bf16 = buffers.bias_grad, bias_grad_fp32 = buffers.bias_grad;
  const bool uses_aux = args.aux != nullptr;
  if (uses_aux) {
    bf16_args.aux = aux_bf16.data();
    fp32_args.aux = aux_fp32.data();
  }
  if (args.bias_grad != nullptr) {
    bf16_args.bias_grad = bias_grad_bf16.data();
    fp32_args.bias_grad = bias_grad_fp32.data();
  }
  if (args.bias != nullptr) bf16_args.bias = fp32_args.bias = buffers.bias.data();
  const std::vector<bf16_bits> a16 = to_bf16(buffers.a), b16 = to_bf16(buffers.b);
  const std::vector<float> a_rounded = rounded(buffers.a), b_rounded = rounded(buffers.b);
  gemm(c_bf16.data(), a16.data(), b16.data(), bf16_args);
  gemm(c_fp32.data(), a_rounded.data(), b_rounded.data(), fp32_args);
  const double tolerance = 1e-5 * (static_cast<double>(args.k) + 2.0);
  for (size_t i = 0; i < c_fp32.size(); ++i)
    ASSERT_NEAR(c_bf16[i], c_fp32[i], tolerance) << GetParam().name << " c[" << i << "]";
  for (size_t i = 0; i < aux_fp32.size(); ++i)
    ASSERT_NEAR(aux_bf16[i], aux_fp32[i], tolerance) << GetParam().name << " aux[" << i << "]";
  for (size_t i = 0; i < bias_grad_fp32.size(); ++i)
    ASSERT_NEAR(bias_grad_bf16[i], bias_grad_fp32[i], tolerance * 8)
        << GetParam().name << " bias_grad[" << i << "]";
}

std::vector<Bf16GemmCase> bf16_gemm_cases() {
  std::vector<Bf16GemmCase> cases;
  GemmArgs plain;
  plain.m = 37, plain.n = 64, plain.k = 96;
  cases.push_back({plain, "plain"});
  GemmArgs linear = plain;  // y = x W^T + b, x a column view
  linear.transpose_b = true, linear.lda = 128, linear.bias = reinterpret_cast<const float*>(1);
  cases.push_back({linear, "linear_bias_view"});
  GemmArgs accumulate = plain;  // dW += dy^T x
  accumulate.transpose_a = true, accumulate.accumulate = true;
  cases.push_back({accumulate, "transposed_accumulate"});
  GemmArgs gelu_aux = linear;
  gelu_aux.epilogue = Epilogue::kGeluTanhAux, gelu_aux.aux = reinterpret_cast<float*>(1);
  cases.push_back({gelu_aux, "gelu_aux"});
  GemmArgs bias_grad = accumulate;
  bias_grad.epilogue = Epilogue::kBiasGradA, bias_grad.bias_grad = reinterpret_cast<float*>(1);
  cases.push_back({bias_grad, "bias_grad_a"});
  GemmArgs batched = plain;
  batched.batch = 3;
  cases.push_back({batched, "batched"});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, Bf16Gemm, testing::ValuesIn(bf16_gemm_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Bf16Gemm, PathMatchesTheIsaCap) {
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (cap != nullptr && std::string(cap) == "AVX2") {
    EXPECT_FALSE(bf16_gemm_native());
  }
  SUCCEED() << bf16_gemm_path();
}

TEST(Bf16Gemm, MixedOperandDtypesAreRefused) {
  GemmArgs args;
  args.m = args.n = args.k = 4;
  std::vector<float> a(16, 1.0f), c(16);
  std::vector<bf16_bits> b(16, float_to_bf16(1.0f));
  EXPECT_THROW(gemm(c.data(), a.data(), b.data(), args), Error);
}

// gemm_bf16_output (the QKV GEMM writing bf16 q, k, v) against gemm's fp32 C rounded by
// float_to_bf16: bit for bit, with a bias, a transposed B, an A column view and a C row stride
// wider than N whose gap it leaves alone. It needs bf16 instructions and takes a bias only.
TEST(Bf16Gemm, Bf16OutputIsTheFp32OutputRounded) {
  GemmArgs args;
  args.m = 37, args.n = 48, args.k = 96;
  args.transpose_b = true, args.lda = 100, args.ldc = 53;
  const std::vector<float> a = gemm_test::uniform(args.m * args.lda, -2, 2, 11);
  const std::vector<float> b = gemm_test::uniform(args.n * args.k, -2, 2, 12);
  const std::vector<float> bias = gemm_test::uniform(args.n, -1, 1, 13);
  std::vector<bf16_bits> a16(a.size()), b16(b.size());
  cast_to_bf16(a16.data(), a.data(), static_cast<int64_t>(a.size()));
  cast_to_bf16(b16.data(), b.data(), static_cast<int64_t>(b.size()));
  args.bias = bias.data();
  const bf16_bits gap = float_to_bf16(7.0f);
  std::vector<bf16_bits> c16(args.m * args.ldc, gap);
  if (!bf16_gemm_native()) {
    EXPECT_THROW(gemm_bf16_output(c16.data(), a16.data(), b16.data(), args), Error);
    GTEST_SKIP() << bf16_gemm_path();
  }
  gemm_bf16_output(c16.data(), a16.data(), b16.data(), args);
  std::vector<float> c32(args.m * args.ldc);
  gemm(c32.data(), a16.data(), b16.data(), args);
  int64_t inexact = 0;
  for (int64_t i = 0; i < args.m; ++i)
    for (int64_t j = 0; j < args.ldc; ++j) {
      const bf16_bits want = j < args.n ? float_to_bf16(c32[i * args.ldc + j]) : gap;
      ASSERT_EQ(c16[i * args.ldc + j], want) << "C[" << i << ", " << j << "]";
      inexact += j < args.n && bf16_to_float(want) != c32[i * args.ldc + j];
    }
  EXPECT_GT(inexact, args.m * args.n / 2) << "the fp32 sums were mostly not bf16 values";
  GemmArgs accumulate = args;
  accumulate.accumulate = true;
  EXPECT_THROW(gemm_bf16_output(c16.data(), a16.data(), b16.data(), accumulate), Error);
}

TEST(CastOp, ForwardRoundsAndBackwardPassesTheGradientThrough) {
  Graph graph;
  const ValueId x = graph.add_value("x", {3, 8});
  const ValueId y = graph.add_value("y", {3, 5}, DType::kBF16);
  const ValueId x_view = graph.add_view("x.cols", x, 2, 5);
  CastOp op(3, 5);
  op.inputs = {x_view};
  op.outputs = {y};
  Workspace ws;
  ws.values = {Tensor::zeros({3, 8}), Tensor::zeros({3, 5}, Device::kCpu, DType::kBF16), Tensor()};
  ws.grads = {Tensor::zeros({3, 8}), Tensor::zeros({3, 5}), Tensor()};
  ws.row_strides = {8, 5, 8};
  const std::vector<float> input = gemm_test::uniform(24, -3, 3, 5);
  std::copy(input.begin(), input.end(), ws.values[x].data());
  ws.values[x_view] = Tensor::wrap(ws.values[x].data() + 2, {3, 5});
  ws.grads[x_view] = Tensor::wrap(ws.grads[x].data() + 2, {3, 5});
  ParamStore params;
  op.forward(ws, params);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 5; ++c)
      EXPECT_EQ(ws.values[y].bf16_data()[r * 5 + c], float_to_bf16(input[r * 8 + 2 + c]));
  const std::vector<float> dy = gemm_test::uniform(15, -1, 1, 6);
  std::copy(dy.begin(), dy.end(), ws.grads[y].data());
  ws.grads[x].fill(0.5f);
  op.backward(ws, params);  // accumulates into the view's columns only
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 8; ++c) {
      const bool inside = c >= 2 && c < 7;
      EXPECT_EQ(ws.grads[x].data()[r * 8 + c], inside ? 0.5f + dy[r * 5 + c - 2] : 0.5f);
    }
}

// The eager attention GEMMs in bf16 (q, k, the probabilities and v are cast ops' outputs) against
// the fp32 ops on the same rounded values, with backward's output gradient rounded once as the
// bf16 path does: only fp32 summation order may differ.
struct AttentionData {
  static constexpr int kBatch = 2, kSeq = 24, kChannels = 32, kHeads = 4;
  static constexpr int64_t kActivation = int64_t{kBatch} * kSeq * kChannels;
  static constexpr int64_t kSquare = int64_t{kBatch} * kHeads * kSeq * kSeq;
  // fp32 rounded to bf16 (the reference reads these) and the same bits as bf16.
  struct Operand {
    std::vector<float> rounded;
    std::vector<bf16_bits> bits;
  };
  static Operand operand(int64_t count, uint32_t seed) {
    Operand result{gemm_test::uniform(static_cast<size_t>(count), -1, 1, seed), {}};
    result.bits.resize(result.rounded.size());
    cast_to_bf16(result.bits.data(), result.rounded.data(), count);
    cast_to_float(result.rounded.data(), result.bits.data(), count);
    return result;
  }
};

void expect_close(const std::vector<float>& expected, const std::vector<float>& actual,
                  const char* what) {
  float largest = 0, worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    largest = std::max(largest, std::fabs(expected[i]));
    worst = std::max(worst, std::fabs(expected[i] - actual[i]));
  }
  EXPECT_GT(largest, 0.0f) << what;
  EXPECT_LE(worst, 1e-5f * largest) << what;
}

TEST(Bf16Attention, ScoresMatchFp32OnRoundedOperands) {
  using D = AttentionData;
  const auto q = D::operand(D::kActivation, 11), k = D::operand(D::kActivation, 12);
  const auto dscores = D::operand(D::kSquare, 13);  // rounded: bf16 backward rounds it once
  std::vector<float> want(D::kSquare), got(D::kSquare);
  attention_scores_forward(want.data(), q.rounded.data(), k.rounded.data(), D::kChannels,
                           D::kChannels, D::kBatch, D::kSeq, D::kChannels, D::kHeads);
  attention_scores_forward(got.data(), q.bits.data(), k.bits.data(), D::kChannels, D::kChannels,
                           D::kBatch, D::kSeq, D::kChannels, D::kHeads);
  expect_close(want, got, "scores");
  std::vector<float> dq_want(D::kActivation), dk_want(D::kActivation);
  std::vector<float> dq_got(D::kActivation), dk_got(D::kActivation);
  attention_scores_backward(dq_want.data(), dk_want.data(), dscores.rounded.data(),
                            q.rounded.data(), k.rounded.data(), D::kChannels, D::kChannels, true,
                            true, D::kBatch, D::kSeq, D::kChannels, D::kHeads);
  attention_scores_backward(dq_got.data(), dk_got.data(), dscores.rounded.data(), q.bits.data(),
                            k.bits.data(), D::kChannels, D::kChannels, true, true, D::kBatch,
                            D::kSeq, D::kChannels, D::kHeads);
  expect_close(dq_want, dq_got, "dq");
  expect_close(dk_want, dk_got, "dk");
}

TEST(Bf16Attention, MixMatchesFp32OnRoundedOperands) {
  using D = AttentionData;
  const auto probs = D::operand(D::kSquare, 21), v = D::operand(D::kActivation, 22);
  // dY as a column view (rows 2C apart, as of a wider buffer), unrounded: the bf16 path must
  // round it into a packed copy; the reference reads the rounded values at the same stride.
  const int64_t dy_stride = 2 * D::kChannels;
  std::vector<float> dy_wide = gemm_test::uniform(D::kActivation * 2, -1, 1, 23);
  std::vector<float> dy_rounded(dy_wide.size());
  for (size_t i = 0; i < dy_wide.size(); ++i) dy_rounded[i] = round_to_bf16(dy_wide[i]);
  std::vector<float> want(D::kActivation), got(D::kActivation);
  attention_mix_forward(want.data(), probs.rounded.data(), v.rounded.data(), D::kChannels,
                        D::kChannels, D::kBatch, D::kSeq, D::kChannels, D::kHeads);
  attention_mix_forward(got.data(), probs.bits.data(), v.bits.data(), D::kChannels, D::kChannels,
                        D::kBatch, D::kSeq, D::kChannels, D::kHeads);
  expect_close(want, got, "y");
  std::vector<float> dp_want(D::kSquare), dv_want(D::kActivation);
  std::vector<float> dp_got(D::kSquare), dv_got(D::kActivation);
  attention_mix_backward(dp_want.data(), dv_want.data(), dy_rounded.data(), probs.rounded.data(),
                         v.rounded.data(), dy_stride, D::kChannels, true, true, D::kBatch, D::kSeq,
                         D::kChannels, D::kHeads);
  attention_mix_backward(dp_got.data(), dv_got.data(), dy_wide.data(), probs.bits.data(),
                         v.bits.data(), dy_stride, D::kChannels, true, true, D::kBatch, D::kSeq,
                         D::kChannels, D::kHeads);
  expect_close(dp_want, dp_got, "dprobs");
  expect_close(dv_want, dv_got, "dv");
}

}  // namespace
}  // namespace ft

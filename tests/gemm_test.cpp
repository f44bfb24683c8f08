// The CPU gemm() front-end (core/gemm.h): each epilogue, leading dimensions, strided batches,
// alpha and accumulate against a double-precision reference, the argument checks shared with
// gemm_cuda (check_gemm_args), stride resolution, and the train.tf32 switch.
#include "core/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/check.h"
#include "core/math/gelu_math.h"
#include "gemm_test_util.h"

namespace ft {
namespace {

// P[b][i][j] = alpha sum_p op(A)[i, p] op(B)[p, j] in double, from resolved strides.
double product(const GemmArgs& r, const std::vector<float>& a, const std::vector<float>& b,
               int64_t batch, int64_t i, int64_t j) {
  double sum = 0.0;
  for (int64_t p = 0; p < r.k; ++p) {
    const double a_ip = r.transpose_a ? a[batch * r.batch_stride_a + p * r.lda + i]
                                      : a[batch * r.batch_stride_a + i * r.lda + p];
    const double b_pj = r.transpose_b ? b[batch * r.batch_stride_b + j * r.ldb + p]
                                      : b[batch * r.batch_stride_b + p * r.ldb + j];
    sum += a_ip * b_pj;
  }
  return r.alpha * sum;
}

using gemm_test::make_gemm_buffers;
using gemm_test::uniform;
using Buffers = gemm_test::GemmBuffers;

// Runs gemm() on `args` (pointers filled from the buffers as its epilogue needs) and checks every
// output entry against the reference; padding between rows must stay untouched.
void expect_gemm_matches_reference(GemmArgs args, bool with_bias, uint32_t seed) {
  Buffers in = make_gemm_buffers(args, seed);
  Buffers out = in;
  const Epilogue e = args.epilogue;
  const bool uses_aux =
      e == Epilogue::kGeluTanhAux || e == Epilogue::kDGeluTanh || e == Epilogue::kDGeluTanhBiasGrad;
  args.bias = with_bias ? out.bias.data() : nullptr;
  args.aux = uses_aux ? out.aux.data() : nullptr;
  args.bias_grad = e == Epilogue::kDGeluTanhBiasGrad || e == Epilogue::kBiasGradA
                       ? out.bias_grad.data()
                       : nullptr;
  gemm(out.c.data(), out.a.data(), out.b.data(), args);

  const GemmArgs r = resolve_gemm_strides(args);
  std::vector<float> want_c = in.c, want_aux = in.aux, want_bias_grad = in.bias_grad;
  if (e == Epilogue::kDGeluTanhBiasGrad) std::fill_n(want_bias_grad.begin(), r.n, 0.0f);
  for (int64_t batch = 0; batch < r.batch; ++batch)
    for (int64_t i = 0; i < r.m; ++i)
      for (int64_t j = 0; j < r.n; ++j) {
        const size_t at = static_cast<size_t>(batch * r.batch_stride_c + i * r.ldc + j);
        double value = product(r, in.a, in.b, batch, i, j) + (r.accumulate ? in.c[at] : 0.0);
        if (with_bias) value += in.bias[j];
        const size_t aux_at = static_cast<size_t>(i * r.ld_aux + j);
        if (e == Epilogue::kRelu) value = std::max(value, 0.0);
        if (e == Epilogue::kGeluTanh) value = gelu_tanh(static_cast<float>(value));
        if (e == Epilogue::kGeluTanhAux) {
          want_aux[aux_at] = static_cast<float>(value);
          value = gelu_tanh(static_cast<float>(value));
        }
        if (e == Epilogue::kDGeluTanh || e == Epilogue::kDGeluTanhBiasGrad)
          value *= gelu_tanh_grad(in.aux[aux_at]);
        if (e == Epilogue::kDGeluTanhBiasGrad) want_bias_grad[j] += static_cast<float>(value);
        want_c[at] = static_cast<float>(value);
      }
  if (e == Epilogue::kBiasGradA)
    for (int64_t i = 0; i < r.m; ++i) {
      double sum = 0.0;
      for (int64_t p = 0; p < r.k; ++p)
        sum += r.transpose_a ? in.a[p * r.lda + i] : in.a[i * r.lda + p];
      want_bias_grad[i] = static_cast<float>(sum);
    }
  const auto expect_close = [](const std::vector<float>& got, const std::vector<float>& want,
                               const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-4 * std::max(1.0f, std::fabs(want[i])))
          << what << "[" << i << "]";
  };
  expect_close(out.c, want_c, "c");
  expect_close(out.aux, want_aux, "aux");
  expect_close(out.bias_grad, want_bias_grad, "bias_grad");
}

GemmArgs shape(int64_t m, int64_t n, int64_t k) {
  GemmArgs args;
  args.m = m;
  args.n = n;
  args.k = k;
  return args;
}

TEST(Gemm, TransposesLeadingDimsAlphaAndAccumulate) {
  GemmArgs args = shape(13, 17, 11);
  expect_gemm_matches_reference(args, false, 1);
  args.transpose_a = true;
  args.lda = 13 + 2;
  args.ldc = 17 + 3;
  expect_gemm_matches_reference(args, false, 2);
  args.transpose_b = true;
  args.ldb = 11 + 4;
  args.alpha = -0.5f;
  args.accumulate = true;
  expect_gemm_matches_reference(args, false, 3);
}

TEST(Gemm, StridedBatchesOfHeadColumns) {
  // 3 heads of hd = 5 inside rows of 15 floats: batch stride hd, row stride 3 hd.
  GemmArgs args = shape(7, 7, 5);
  args.batch = 3;
  args.transpose_b = true;
  args.lda = args.ldb = 15;
  args.batch_stride_a = args.batch_stride_b = 5;
  args.alpha = 0.25f;
  expect_gemm_matches_reference(args, false, 4);
}

TEST(Gemm, ForwardEpilogues) {
  for (const Epilogue e : {Epilogue::kNone, Epilogue::kRelu, Epilogue::kGeluTanh}) {
    SCOPED_TRACE(epilogue_name(e));
    GemmArgs args = shape(9, 12, 8);
    args.transpose_b = true;
    args.epilogue = e;
    expect_gemm_matches_reference(args, true, 5);
  }
}

TEST(Gemm, GeluAuxKeepsThePreactivation) {
  GemmArgs args = shape(9, 12, 8);
  args.transpose_b = true;
  args.epilogue = Epilogue::kGeluTanhAux;
  args.ld_aux = 14;
  args.ldc = 13;
  expect_gemm_matches_reference(args, true, 6);
  args.ld_aux = 0;
  expect_gemm_matches_reference(args, false, 7);
}

TEST(Gemm, DGeluAndBiasGradients) {
  GemmArgs args = shape(10, 6, 9);
  args.epilogue = Epilogue::kDGeluTanh;
  expect_gemm_matches_reference(args, false, 8);
  args.epilogue = Epilogue::kDGeluTanhBiasGrad;
  args.ldc = 8;
  expect_gemm_matches_reference(args, false, 9);
  // dW += dy^T x with db = colsum(dy): A = dy stored [K, M].
  GemmArgs weight_grad = shape(6, 5, 10);
  weight_grad.transpose_a = true;
  weight_grad.accumulate = true;
  weight_grad.epilogue = Epilogue::kBiasGradA;
  expect_gemm_matches_reference(weight_grad, false, 10);
  weight_grad.transpose_a = false;
  weight_grad.lda = 12;
  expect_gemm_matches_reference(weight_grad, false, 11);
}

TEST(Gemm, ResolvesPackedStrides) {
  GemmArgs args = shape(3, 4, 5);
  args.transpose_a = true;
  args.transpose_b = true;
  args.ldc = 9;
  const GemmArgs r = resolve_gemm_strides(args);
  EXPECT_EQ(r.lda, 3);
  EXPECT_EQ(r.ldb, 5);
  EXPECT_EQ(r.ldc, 9);
  EXPECT_EQ(r.ld_aux, 4);
  EXPECT_EQ(r.batch_stride_a, 15);
  EXPECT_EQ(r.batch_stride_b, 20);
  EXPECT_EQ(r.batch_stride_c, 12);
}

// Each inconsistent GemmArgs throws with a message naming what is wrong.
void expect_rejected(const GemmArgs& args, const std::string& phrase) {
  try {
    check_gemm_args(args, "gemm");
    ADD_FAILURE() << "accepted; expected: " << phrase;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(phrase), std::string::npos) << error.what();
  }
}

TEST(Gemm, RejectsInconsistentArguments) {
  float buffer[64] = {};
  const GemmArgs valid = shape(4, 4, 4);
  EXPECT_NO_THROW(check_gemm_args(valid, "gemm"));
  GemmArgs args = valid;
  args.k = 0;
  expect_rejected(args, "empty shape");
  args = valid;
  args.lda = 3;
  expect_rejected(args, "leading dimension too small");
  args = valid;
  args.epilogue = Epilogue::kGeluTanh;
  args.accumulate = true;
  expect_rejected(args, "accumulate with the gelu_tanh epilogue");
  args = valid;
  args.bias = buffer;
  args.alpha = 2.0f;
  expect_rejected(args, "alpha with bias");
  args = valid;
  args.epilogue = Epilogue::kDGeluTanh;
  expect_rejected(args, "dgelu_tanh epilogue needs aux");
  args.aux = buffer;
  args.bias = buffer;
  expect_rejected(args, "dgelu_tanh epilogue takes no bias");
  args = valid;
  args.aux = buffer;
  expect_rejected(args, "none epilogue takes no aux");
  args = valid;
  args.epilogue = Epilogue::kBiasGradA;
  expect_rejected(args, "bias_grad_a epilogue needs bias_grad");
  args.bias_grad = buffer;
  args.alpha = 0.5f;
  expect_rejected(args, "alpha with the bias_grad_a epilogue");
  args.alpha = 1.0f;
  args.batch = 2;
  expect_rejected(args, "needs batch 1");
  args = valid;
  args.epilogue = Epilogue::kGeluTanhAux;
  args.aux = buffer;
  args.ld_aux = 2;
  expect_rejected(args, "ld_aux 2 < n 4");
  // gemm() itself runs the same checks.
  args = valid;
  args.epilogue = Epilogue::kDGeluTanhBiasGrad;
  args.aux = buffer;
  EXPECT_THROW(gemm(buffer, buffer, buffer, args), Error);
}

TEST(Gemm, Tf32SwitchDefaultsOffAndLeavesTheCpuResultAlone) {
  EXPECT_FALSE(gemm_tf32());
  const GemmArgs args = shape(8, 8, 64);
  Buffers in = make_gemm_buffers(args, 12);
  std::vector<float> fp32(64), with_tf32(64);
  gemm(fp32.data(), in.a.data(), in.b.data(), args);
  set_gemm_tf32(true);
  EXPECT_TRUE(gemm_tf32());
  gemm(with_tf32.data(), in.a.data(), in.b.data(), args);
  set_gemm_tf32(false);
  EXPECT_FALSE(gemm_tf32());
  EXPECT_EQ(with_tf32, fp32);
}

}  // namespace
}  // namespace ft

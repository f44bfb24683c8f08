// Causal self-attention (see attention.h). Per sequence b, with heads as the gemm batch:
//   S = scale * Q K^T,  P = causal_softmax(S),  Y = P V.
// The upper triangle of S is computed by the gemm and then overwritten with zero probabilities,
// which keeps every matmul a plain dense gemm.
#include "model/ops/attention.h"

#include <cmath>

#include "core/check.h"
#include "core/gemm.h"
#include "model/ops/op_checks.h"

namespace ft {
namespace {

// Gemm arguments with the heads of one sequence as the batch; callers add strides and layouts.
GemmArgs head_gemm(int64_t m, int64_t n, int64_t k, int n_head) {
  GemmArgs args;
  args.m = m;
  args.n = n;
  args.k = k;
  args.batch = n_head;
  return args;
}

}  // namespace

void attention_forward(float* y, float* probs, const float* qkv, int batch, int seq_len,
                       int channels, int n_head) {
  const int64_t T = seq_len, C = channels, hd = channels / n_head;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int b = 0; b < batch; ++b) {
    const float* q = qkv + b * T * 3 * C;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* p = probs + b * n_head * T * T;
    // S[h] = scale * Q[h] K[h]^T: [T, hd] x [hd, T]; K[h] is stored [T, hd] = [N, K].
    GemmArgs scores = head_gemm(T, T, hd, n_head);
    scores.transpose_b = true;
    scores.lda = scores.ldb = 3 * C;
    scores.batch_stride_a = scores.batch_stride_b = hd;
    scores.alpha = scale;
    gemm(p, q, k, scores);

#pragma omp parallel for if (n_head * T * T > 65536)
    for (int64_t row = 0; row < n_head * T; ++row) {
      const int64_t t = row % T;
      float* p_row = p + row * T;
      float max_score = p_row[0];
#pragma omp simd reduction(max : max_score)
      for (int64_t s = 1; s <= t; ++s) max_score = p_row[s] > max_score ? p_row[s] : max_score;
      float sum = 0.0f;
      for (int64_t s = 0; s <= t; ++s) {
        p_row[s] = std::exp(p_row[s] - max_score);
        sum += p_row[s];
      }
      const float inv_sum = 1.0f / sum;
      for (int64_t s = 0; s <= t; ++s) p_row[s] *= inv_sum;
      for (int64_t s = t + 1; s < T; ++s) p_row[s] = 0.0f;
    }

    // Y[h] = P[h] V[h]: [T, T] x [T, hd], written into head h's columns of y.
    GemmArgs mix = head_gemm(T, hd, T, n_head);
    mix.ldb = 3 * C;
    mix.batch_stride_b = hd;
    mix.ldc = C;
    mix.batch_stride_c = hd;
    gemm(y + b * T * C, p, v, mix);
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dy, const float* qkv,
                        const float* probs, int batch, int seq_len, int channels, int n_head) {
  const int64_t T = seq_len, C = channels, hd = channels / n_head;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int b = 0; b < batch; ++b) {
    const float* q = qkv + b * T * 3 * C;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + b * T * 3 * C;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* dy_b = dy + b * T * C;
    const float* p = probs + b * n_head * T * T;
    float* dp = scratch;

    // Y = P V  =>  dP = dY V^T   ([T, hd] x [hd, T]; V stored [T, hd] = [N, K])
    GemmArgs dprobs = head_gemm(T, T, hd, n_head);
    dprobs.transpose_b = true;
    dprobs.lda = C;
    dprobs.ldb = 3 * C;
    dprobs.batch_stride_a = dprobs.batch_stride_b = hd;
    gemm(dp, dy_b, v, dprobs);
    //           dV += P^T dY     ([T, T] x [T, hd]; P stored [T, T] = [K, M])
    GemmArgs dvalues = head_gemm(T, hd, T, n_head);
    dvalues.transpose_a = true;
    dvalues.ldb = C;
    dvalues.batch_stride_b = hd;
    dvalues.ldc = 3 * C;
    dvalues.batch_stride_c = hd;
    dvalues.accumulate = true;
    gemm(dv, p, dy_b, dvalues);

    // P = softmax(S) row-wise  =>  dS[t, s] = P[t, s] (dP[t, s] - sum_s' P[t, s'] dP[t, s']).
    // Masked entries have P = 0, so their dS is zero; the 1/sqrt(hd) of S = scale Q K^T is
    // folded in here so the two gemms below need no alpha.
#pragma omp parallel for if (n_head * T * T > 65536)
    for (int64_t row = 0; row < n_head * T; ++row) {
      const int64_t t = row % T;
      const float* p_row = p + row * T;
      float* d_row = dp + row * T;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t s = 0; s <= t; ++s) dot += p_row[s] * d_row[s];
      for (int64_t s = 0; s <= t; ++s) d_row[s] = scale * p_row[s] * (d_row[s] - dot);
      for (int64_t s = t + 1; s < T; ++s) d_row[s] = 0.0f;
    }

    // S' = Q K^T  =>  dQ += dS' K   ([T, T] x [T, hd])
    GemmArgs dqueries = head_gemm(T, hd, T, n_head);
    dqueries.ldb = 3 * C;
    dqueries.batch_stride_b = hd;
    dqueries.ldc = 3 * C;
    dqueries.batch_stride_c = hd;
    dqueries.accumulate = true;
    gemm(dq, dp, k, dqueries);
    //                 dK += dS'^T Q  ([T, T] x [T, hd]; dS' stored [T, T] = [K, M])
    GemmArgs dkeys = dqueries;
    dkeys.transpose_a = true;
    gemm(dk, dp, q, dkeys);
  }
}

CausalSelfAttentionOp::CausalSelfAttentionOp(int batch, int seq_len, int channels, int n_head)
    : batch_(batch), seq_len_(seq_len), channels_(channels), n_head_(n_head) {
  FT_CHECK(batch > 0 && seq_len > 0 && channels > 0 && n_head > 0,
           "CausalSelfAttentionOp: non-positive shape batch=", batch, " seq_len=", seq_len,
           " channels=", channels, " n_head=", n_head);
  FT_CHECK(channels % n_head == 0, "CausalSelfAttentionOp: channels ", channels,
           " not divisible by n_head ", n_head);
}

void CausalSelfAttentionOp::check_wiring(const Workspace& ws) const {
  expect_arity(*this, 1, 1, 0);
  const int64_t tokens = static_cast<int64_t>(batch_) * seq_len_;
  expect_numel(ws.values[inputs[0]], tokens * 3 * channels_, *this, "input qkv");
  expect_numel(ws.values[outputs[0]], tokens * channels_, *this, "output y");
}

void CausalSelfAttentionOp::forward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  const int64_t T = seq_len_;
  if (probs_.numel() != batch_ * n_head_ * T * T) probs_ = Tensor::empty({batch_, n_head_, T, T});
  attention_forward(ws.values[outputs[0]].data(), probs_.data(), ws.values[inputs[0]].data(),
                    batch_, seq_len_, channels_, n_head_);
}

void CausalSelfAttentionOp::backward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  const int64_t T = seq_len_;
  FT_CHECK(probs_.numel() == batch_ * n_head_ * T * T, "attention '", name,
           "': backward before forward");
  if (scratch_.numel() != n_head_ * T * T) scratch_ = Tensor::empty({n_head_, T, T});
  attention_backward(ws.grads[inputs[0]].data(), scratch_.data(), ws.grads[outputs[0]].data(),
                     ws.values[inputs[0]].data(), probs_.data(), batch_, seq_len_, channels_,
                     n_head_);
}

}  // namespace ft

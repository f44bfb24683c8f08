// Helpers shared by the attention ops (model/ops/attention_scores, causal_softmax,
// attention_mix and fusion/ops/flash_attention): shape checks at construction, FLOP counts and
// the head-batched gemm arguments that address head h's columns of a [T, C] activation in place
// (leading dimension = row stride, batch stride = hd).
// Thread safety: stateless.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "core/gemm.h"

namespace ft {

inline void check_attention_shape(const char* op, int batch, int seq_len, int channels,
                                  int n_head) {
  FT_CHECK(batch > 0 && seq_len > 0 && channels > 0 && n_head > 0, op,
           ": non-positive shape batch=", batch, " seq_len=", seq_len, " channels=", channels,
           " n_head=", n_head);
  FT_CHECK(channels % n_head == 0, op, ": channels ", channels, " not divisible by n_head ",
           n_head);
}

// Gemm arguments with the heads of one sequence as the batch; callers add strides and layouts.
inline GemmArgs head_gemm(int64_t m, int64_t n, int64_t k, int n_head) {
  GemmArgs args;
  args.m = m;
  args.n = n;
  args.k = k;
  args.batch = n_head;
  return args;
}

// Per head, the [T, T] block times head h's columns of b, into head h's columns of c (rows of b
// and c are `b_stride` / `c_stride` floats apart): Y = P V, dV = P^T dY (callers transpose a),
// dQ = dS K.
inline GemmArgs square_by_head_gemm(int64_t seq_len, int64_t head_dim, int n_head, int64_t b_stride,
                                    int64_t c_stride) {
  GemmArgs args = head_gemm(seq_len, head_dim, seq_len, n_head);
  args.ldb = b_stride;
  args.batch_stride_b = head_dim;
  args.ldc = c_stride;
  args.batch_stride_c = head_dim;
  return args;
}

// Per head, head h's columns of a times those of b transposed, into a [T, T] block (b is stored
// [T, hd] = [N, K]): S = Q K^T (callers set the scale), dP = dY V^T.
inline GemmArgs head_by_head_transposed_gemm(int64_t seq_len, int64_t head_dim, int n_head,
                                             int64_t a_stride, int64_t b_stride) {
  GemmArgs args = head_gemm(seq_len, seq_len, head_dim, n_head);
  args.transpose_b = true;
  args.lda = a_stride;
  args.ldb = b_stride;
  args.batch_stride_a = args.batch_stride_b = head_dim;
  return args;
}

// The GEMMs of the eager attention ops, the same for the oneDNN and the cuBLASLt kernels (per
// sequence; the heads are the batch).
// S = scale Q K^T.
inline GemmArgs attention_scores_gemm(int64_t seq_len, int64_t head_dim, int n_head,
                                      int64_t q_stride, int64_t k_stride) {
  GemmArgs args = head_by_head_transposed_gemm(seq_len, head_dim, n_head, q_stride, k_stride);
  args.alpha = 1.0f / std::sqrt(static_cast<float>(head_dim));
  return args;
}

// S = scale Q K^T  =>  dQ (=|+=) scale dS K     ([T, T] x [T, hd])
//                      dK (=|+=) scale dS^T Q   ([T, T] x [T, hd]; dS stored [T, T] = [K, M])
struct AttentionScoresGradGemms {
  GemmArgs dqueries, dkeys;
};
inline AttentionScoresGradGemms attention_scores_grad_gemms(int64_t seq_len, int64_t head_dim,
                                                            int n_head, int64_t q_stride,
                                                            int64_t k_stride, bool overwrite_dq,
                                                            bool overwrite_dk) {
  AttentionScoresGradGemms gemms;
  gemms.dqueries = square_by_head_gemm(seq_len, head_dim, n_head, k_stride, q_stride);
  gemms.dqueries.alpha = 1.0f / std::sqrt(static_cast<float>(head_dim));
  gemms.dqueries.accumulate = !overwrite_dq;
  gemms.dkeys = gemms.dqueries;
  gemms.dkeys.transpose_a = true;
  gemms.dkeys.ldb = q_stride;
  gemms.dkeys.ldc = k_stride;
  gemms.dkeys.accumulate = !overwrite_dk;
  return gemms;
}

// Y = P V  =>  dP (=|+=) dY V^T   ([T, hd] x [hd, T]; V stored [T, hd] = [N, K])
//              dV (=|+=) P^T dY   ([T, T] x [T, hd]; P stored [T, T] = [K, M])
struct AttentionMixGradGemms {
  GemmArgs dprobs, dvalues;
};
inline AttentionMixGradGemms attention_mix_grad_gemms(int64_t seq_len, int64_t head_dim, int n_head,
                                                      int64_t y_stride, int64_t v_stride,
                                                      bool overwrite_dprobs, bool overwrite_dv) {
  AttentionMixGradGemms gemms;
  gemms.dprobs = head_by_head_transposed_gemm(seq_len, head_dim, n_head, y_stride, v_stride);
  gemms.dprobs.accumulate = !overwrite_dprobs;
  gemms.dvalues = square_by_head_gemm(seq_len, head_dim, n_head, y_stride, v_stride);
  gemms.dvalues.transpose_a = true;
  gemms.dvalues.accumulate = !overwrite_dv;
  return gemms;
}

// Multiply-adds of one [T, hd] x [hd, T]-sized product per head and sequence (Q K^T or P V).
inline double attention_head_macs(int batch, int seq_len, int channels, int n_head) {
  return static_cast<double>(batch) * n_head * seq_len * seq_len * (channels / n_head);
}

}  // namespace ft

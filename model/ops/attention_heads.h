// Helpers shared by the attention ops (model/ops/attention_scores, causal_softmax,
// attention_mix and fusion/ops/flash_attention): shape checks at construction, FLOP counts and
// the head-batched gemm arguments that address head h's columns of a [T, C] activation in place
// (leading dimension = row stride, batch stride = hd).
// Thread safety: stateless.
#pragma once
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

// Multiply-adds of one [T, hd] x [hd, T]-sized product per head and sequence (Q K^T or P V).
inline double attention_head_macs(int batch, int seq_len, int channels, int n_head) {
  return static_cast<double>(batch) * n_head * seq_len * seq_len * (channels / n_head);
}

}  // namespace ft

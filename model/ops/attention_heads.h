// Helpers shared by the attention ops (model/ops/attention_scores, causal_softmax,
// attention_mix and fusion/ops/flash_attention): shape checks at construction and the
// head-batched gemm arguments that address head h's columns of a [T, C] activation in place
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

}  // namespace ft

// Linear+GELU's bf16 row loops (fusion/ops/linear_gelu.cpp) in AVX-512 with the AVX512-BF16
// rounding instruction, for CPUs that have it: the same arithmetic as core/math/gelu_math.h and
// fast_exp, operation for operation in the same order (no contraction beyond fast_exp's explicit
// fused multiply-adds, written as vfmadd here), so every fp32 value
// is the generic loop's bit for bit, and each rounded with vcvtneps2bf16 (nearest even, as
// float_to_bf16) where the generic loop spends eight integer operations per vector. That
// instruction reads an fp32 denormal as 0 where float_to_bf16 keeps it; the executor runs with
// denormals flushed (core/denormals.h), so none reaches it.
// Thread safety: pure functions on caller-owned rows.
#pragma once
#include <cstdint>

#include "core/math/bf16_math.h"

namespace ft {

// True when this build compiled the AVX-512 loops, the CPU runs them and the bf16 GEMMs run
// natively (bf16_gemm_native(), so ONEDNN_MAX_CPU_ISA=AVX2 keeps the generic loops, which the
// widening-path tests then cover). Decided once per process; tests may switch it off.
bool gelu_rows_avx512_enabled();
void set_gelu_rows_avx512_for_testing(bool allowed);

// For i < count: out[i] = float_to_bf16(gelu_tanh(pre[i])) and grad[i] = gelu_tanh_grad(pre[i]),
// the sigmoid term computed once for both. REQUIRES: gelu_rows_avx512_enabled().
void gelu_and_grad_row_bf16_avx512(bf16_bits* out, float* grad, const float* pre, int64_t count);
// For i in [begin, end): g = dy[i] grad[i] (grad = gelu' as kept by forward); dbias[i] += g (when
// dbias is not null); dpre[i] = float_to_bf16(g). REQUIRES: gelu_rows_avx512_enabled().
void gelu_backward_row_bf16_avx512(bf16_bits* dpre, float* dbias, const float* dy,
                                   const float* grad, int64_t begin, int64_t end);

}  // namespace ft

// The run-time choice of gelu_rows_avx512.h, compiled for the build's own target.
#include <atomic>

#include "core/check.h"
#include "core/gemm.h"
#include "fusion/ops/gelu_rows_avx512.h"

namespace ft {
namespace {

std::atomic<bool> allowed_for_testing{true};

bool cpu_runs_them() {
#if FT_GELU_ROWS_AVX512
  return avx512_bf16_kernels_run();
#else
  return false;
#endif
}

}  // namespace

bool gelu_rows_avx512_enabled() {
  return allowed_for_testing.load(std::memory_order_relaxed) && cpu_runs_them();
}

void set_gelu_rows_avx512_for_testing(bool allowed) {
  allowed_for_testing.store(allowed, std::memory_order_relaxed);
}

#if !FT_GELU_ROWS_AVX512
void gelu_and_grad_row_bf16_avx512(bf16_bits*, float*, const float*, int64_t) {
  FT_CHECK(false, "gelu_and_grad_row_bf16_avx512: this build has no AVX512-BF16 loops");
}
void gelu_backward_row_bf16_avx512(bf16_bits*, float*, const float*, const float*, int64_t,
                                   int64_t) {
  FT_CHECK(false, "gelu_backward_row_bf16_avx512: this build has no AVX512-BF16 loops");
}
#endif

}  // namespace ft

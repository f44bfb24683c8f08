// The casts of comm.grad_dtype: bf16: a gradient bucket rounded from fp32 to bf16 before its
// allreduce, and widened back with the gradient scale applied in fp32 afterwards (one rounding,
// not two). The CPU rounding is core/bf16_cast.h's cast_to_bf16; the widening is here; the CUDA
// twins run on a stream, compiled only with CUDA (comm/grad_cast.cu). Both use
// core/math/bf16_math.h, so they round the same bits. Thread safety: pure functions of their
// arguments.
#pragma once
#include <cstdint>

#include "core/device.h"
#include "core/math/bf16_math.h"

namespace ft {

// out[i] = float(in[i]) * scale for i < count.
inline void cast_from_bf16_scaled(float* out, const bf16_bits* in, int64_t count, float scale) {
  for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_float(in[i]) * scale;
}

// The same on device memory, enqueued on `stream`. Defined only in CUDA builds.
void cuda_cast_to_bf16(bf16_bits* out, const float* in, int64_t count, CudaStream stream);
void cuda_cast_from_bf16_scaled(float* out, const bf16_bits* in, int64_t count, float scale,
                                CudaStream stream);

}  // namespace ft

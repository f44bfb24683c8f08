// CastOp: the fp32 -> bf16 copy of a GEMM operand under train.precision: bf16, one per operand
// as PyTorch's CPU autocast launches one (aten::to) before each bf16 matmul:
//   y[r, c] = bf16(x[r, c])            (round to nearest even, core/math/bf16_math.h)
// Backward is the identity on the fp32 gradients every value has: dx (+)= dy.
// Inputs {x fp32 [rows, cols]}, outputs {y bf16 [rows, cols]}; either may be a column view.
// fusion/cast_pass.cpp removes these where the producer of x can write bf16 itself.
// Thread safety: one training thread per op; the loops run on OpenMP.
#pragma once
#include <cstdint>

#include "core/device.h"
#include "core/math/bf16_math.h"
#include "model/graph.h"

namespace ft {

// Strides are elements between rows (0 = packed).
void cast_forward(bf16_bits* y, const float* x, int64_t rows, int64_t cols, int64_t y_stride,
                  int64_t x_stride);
// dx (+)= dy; `=` when dx_fresh.
void cast_backward(float* dx, const float* dy, int64_t rows, int64_t cols, int64_t dx_stride,
                   int64_t dy_stride, bool dx_fresh);

// The same on device pointers, enqueued on `stream` (cast.cu; CUDA builds only).
void cast_forward_cuda(bf16_bits* y, const float* x, int64_t rows, int64_t cols, int64_t y_stride,
                       int64_t x_stride, CudaStream stream);
void cast_backward_cuda(float* dx, const float* dy, int64_t rows, int64_t cols, int64_t dx_stride,
                        int64_t dy_stride, bool dx_fresh, CudaStream stream);

class CastOp : public Op {
 public:
  CastOp(int64_t rows, int64_t cols);
  OpKind op_kind() const override { return OpKind::kCast; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool overwrites_fresh_input_grads() const override { return true; }
  bool supports_views() const override { return true; }
  bool handles_bf16() const override { return true; }

 private:
  int64_t rows_, cols_;
};

}  // namespace ft

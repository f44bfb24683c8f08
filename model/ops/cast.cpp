#include "model/ops/cast.h"

#include "core/bf16_cast.h"
#include "core/check.h"
#include "model/ops/op_checks.h"

namespace ft {

void cast_forward(bf16_bits* y, const float* x, int64_t rows, int64_t cols, int64_t y_stride,
                  int64_t x_stride) {
  cast_rows_to_bf16(y, y_stride, x, x_stride, rows, cols);
}

void cast_backward(float* dx, const float* dy, int64_t rows, int64_t cols, int64_t dx_stride,
                   int64_t dy_stride, bool dx_fresh) {
  if (dx_stride == 0) dx_stride = cols;
  if (dy_stride == 0) dy_stride = cols;
#pragma omp parallel for if (rows * cols > 65536)
  for (int64_t row = 0; row < rows; ++row) {
    float* dx_row = dx + row * dx_stride;
    const float* dy_row = dy + row * dy_stride;
    if (dx_fresh)
      for (int64_t col = 0; col < cols; ++col) dx_row[col] = dy_row[col];
    else
      for (int64_t col = 0; col < cols; ++col) dx_row[col] += dy_row[col];
  }
}

CastOp::CastOp(int64_t rows, int64_t cols) : rows_(rows), cols_(cols) {
  FT_CHECK(rows > 0 && cols > 0, "CastOp: non-positive shape rows=", rows, " cols=", cols);
  eager_casts = 1;
}

void CastOp::forward(Workspace& ws, ParamStore& params) {
  static_cast<void>(params);
  expect_arity(*this, 1, 1, 0);
  expect_numel(ws.values[inputs[0]], rows_ * cols_, *this, "input x");
  expect_numel(ws.values[outputs[0]], rows_ * cols_, *this, "output y");
  bf16_bits* y = ws.values[outputs[0]].bf16_data();
  const float* x = ws.values[inputs[0]].data();
  FT_RUN_ON_CUDA(ws, cast_forward_cuda(y, x, rows_, cols_, ws.row_stride(outputs[0]),
                                       ws.row_stride(inputs[0]), ws.stream));
  cast_forward(y, x, rows_, cols_, ws.row_stride(outputs[0]), ws.row_stride(inputs[0]));
}

void CastOp::backward(Workspace& ws, ParamStore& params) {
  static_cast<void>(params);
  Tensor& dx = ws.grads[inputs[0]];
  if (!dx.defined() || dx.numel() == 0) return;
  const bool fresh = ws.grad_is_fresh(inputs[0]);
  const float* dy = ws.grads[outputs[0]].data();
  FT_RUN_ON_CUDA(ws, cast_backward_cuda(dx.data(), dy, rows_, cols_, ws.row_stride(inputs[0]),
                                        ws.row_stride(outputs[0]), fresh, ws.stream));
  cast_backward(dx.data(), dy, rows_, cols_, ws.row_stride(inputs[0]), ws.row_stride(outputs[0]),
                fresh);
}

}  // namespace ft

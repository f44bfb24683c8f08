// Linear layer: y = x W^T + b, with W in nn.Linear layout [out, in]. All three matmuls go through
// oneDNN (core/gemm.h); the transposes are expressed as layout flags, never materialised.
#include "model/ops/linear.h"

#include "core/check.h"
#include "core/gemm.h"
#include "model/ops/op_checks.h"

namespace ft {

void linear_forward(float* y, const float* x, const float* weight, const float* bias, int64_t rows,
                    int64_t in_features, int64_t out_features) {
  GemmArgs args;
  args.m = rows;
  args.n = out_features;
  args.k = in_features;
  args.transpose_b = true;  // W is stored [out, in] = [N, K]
  args.bias = bias;
  gemm(y, x, weight, args);
}

void linear_backward(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                     const float* weight, int64_t rows, int64_t in_features, int64_t out_features) {
  // y = x W^T  =>  dx = dy W          ([rows, out] · [out, in])
  if (dx != nullptr) {
    GemmArgs args;
    args.m = rows;
    args.n = in_features;
    args.k = out_features;
    args.accumulate = true;
    gemm(dx, dy, weight, args);
  }
  //                dW = dy^T x        ([out, rows] · [rows, in]; dy stored [rows, out] = [K, M])
  {
    GemmArgs args;
    args.m = out_features;
    args.n = in_features;
    args.k = rows;
    args.transpose_a = true;
    args.accumulate = true;
    gemm(dweight, dy, x, args);
  }
  // y = ... + b broadcast over rows  =>  db = sum over rows of dy
  if (dbias != nullptr) {
    for (int64_t row = 0; row < rows; ++row) {
      const float* dy_row = dy + row * out_features;
      for (int64_t o = 0; o < out_features; ++o) dbias[o] += dy_row[o];
    }
  }
}

LinearOp::LinearOp(int64_t rows, int64_t in_features, int64_t out_features, bool has_bias)
    : rows_(rows), in_features_(in_features), out_features_(out_features), has_bias_(has_bias) {
  FT_CHECK(rows > 0 && in_features > 0 && out_features > 0,
           "LinearOp: non-positive shape rows=", rows, " in=", in_features, " out=", out_features);
}

void LinearOp::check_wiring(const Workspace& ws, const ParamStore& params) const {
  expect_arity(*this, 1, 1, has_bias_ ? 2 : 1);
  expect_numel(ws.values[inputs[0]], rows_ * in_features_, *this, "input x");
  expect_numel(ws.values[outputs[0]], rows_ * out_features_, *this, "output y");
  expect_numel(params[this->params[0]].value, out_features_ * in_features_, *this, "weight");
  if (has_bias_) expect_numel(params[this->params[1]].value, out_features_, *this, "bias");
}

void LinearOp::forward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  const float* bias = has_bias_ ? params[this->params[1]].value.data() : nullptr;
  linear_forward(ws.values[outputs[0]].data(), ws.values[inputs[0]].data(),
                 params[this->params[0]].value.data(), bias, rows_, in_features_, out_features_);
}

void LinearOp::backward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  float* dbias = has_bias_ ? params[this->params[1]].grad.data() : nullptr;
  linear_backward(ws.grads[inputs[0]].data(), params[this->params[0]].grad.data(), dbias,
                  ws.grads[outputs[0]].data(), ws.values[inputs[0]].data(),
                  params[this->params[0]].value.data(), rows_, in_features_, out_features_);
}

}  // namespace ft

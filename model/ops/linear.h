// Fully connected layer, nn.Linear layout: y[rows, out] = x[rows, in] · W[out, in]^T + b[out].
// Inputs {x}, outputs {y}, params {weight [out, in], bias [out] when has_bias}.
// The free functions are the math; LinearOp wires them to a graph. Fusions reuse the functions.
// Thread safety: an op instance belongs to one training thread (gemm runs on oneDNN's pool).
#pragma once
#include <cstdint>

#include "model/graph.h"

namespace ft {

// y = x W^T + b. `bias` may be null.
void linear_forward(float* y, const float* x, const float* weight, const float* bias, int64_t rows,
                    int64_t in_features, int64_t out_features);
// dx += dy W; dweight += dy^T x; dbias += colsum(dy). `dx` and `dbias` may be null (skipped).
void linear_backward(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                     const float* weight, int64_t rows, int64_t in_features, int64_t out_features);

class LinearOp : public Op {
 public:
  LinearOp(int64_t rows, int64_t in_features, int64_t out_features, bool has_bias);
  const char* kind() const override { return "linear"; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;

  int64_t rows() const { return rows_; }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  bool has_bias() const { return has_bias_; }

 private:
  void check_wiring(const Workspace& ws, const ParamStore& params) const;

  int64_t rows_, in_features_, out_features_;
  bool has_bias_;
};

}  // namespace ft

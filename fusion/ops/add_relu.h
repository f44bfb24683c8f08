// AddReluOp: vertical fusion of a ResNet block's residual add and the ReLU after it,
//   y = max(a + b, 0)
// in one pass, so the sum never reaches memory. Backward: with s = a + b and y = relu(s),
// dL/ds = dy * [s > 0] = dy * [y > 0] (read from the saved output, as ReluOp does), and a sum
// passes its gradient unchanged to both summands, so da = db = dy * [y > 0].
// The unfused twin is ResidualAddOp (model/ops/residual.h) followed by ReluOp
// (model/ops/relu.h); fusion/bn_relu_pass.cpp builds this op from them.
// Inputs {a, b} (numel floats each), outputs {y [numel]}, no params.
// Thread safety: one training thread per op; loops are parallel with OpenMP.
#pragma once
#include <cstdint>

#include "core/device.h"
#include "model/graph.h"

namespace ft {

// y = a + b > 0 ? a + b : 0, the same float expression as residual_forward then relu_forward.
void add_relu_forward(float* y, const float* a, const float* b, int64_t numel);
// da (+)= dy * [y > 0] and db (+)= dy * [y > 0]; `=` for a fresh gradient.
void add_relu_backward(float* da, float* db, const float* dy, const float* y, int64_t numel,
                       bool da_fresh, bool db_fresh);

// The same on device pointers, enqueued on `stream` (add_relu.cu; CUDA builds only).
void add_relu_forward_cuda(float* y, const float* a, const float* b, int64_t numel,
                           CudaStream stream);
void add_relu_backward_cuda(float* da, float* db, const float* dy, const float* y, int64_t numel,
                            bool da_fresh, bool db_fresh, CudaStream stream);

class AddReluOp : public Op {
 public:
  explicit AddReluOp(int64_t numel);

  OpKind op_kind() const override { return OpKind::kAddRelu; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool overwrites_fresh_input_grads() const override { return true; }
  OpCost cost(const Graph& graph) const override;

  int64_t numel() const { return numel_; }

 private:
  void check_wiring(const Workspace& ws) const;
  int64_t numel_;
};

}  // namespace ft

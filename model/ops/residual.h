// Residual connection: out = a + b, elementwise over `numel` floats. Inputs {a, b}, outputs {out}.
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <cstdint>

#include "model/graph.h"

namespace ft {

void residual_forward(float* out, const float* a, const float* b, int64_t numel);
// da (+)= dout and db (+)= dout; `=` for a fresh gradient (see Op::overwrites_fresh_input_grads).
void residual_backward(float* da, float* db, const float* dout, int64_t numel, bool fresh_a = false,
                       bool fresh_b = false);
// The same on device pointers, enqueued on `stream` (residual.cu; CUDA builds only).
void residual_forward_cuda(float* out, const float* a, const float* b, int64_t numel,
                           CudaStream stream);
void residual_backward_cuda(float* da, float* db, const float* dout, int64_t numel, bool fresh_a,
                            bool fresh_b, CudaStream stream);

class ResidualAddOp : public Op {
 public:
  explicit ResidualAddOp(int64_t numel);
  OpKind op_kind() const override { return OpKind::kResidualAdd; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  OpCost cost(const Graph& graph) const override;
  bool overwrites_fresh_input_grads() const override { return true; }

 private:
  void check_wiring(const Workspace& ws) const;
  int64_t numel_;
};

}  // namespace ft

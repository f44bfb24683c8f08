// Vertical fusion of ReLU -> cast under train.precision: bf16 (a ResNet's ReLU feeding a
// convolution when fusion.vertical.bn_relu is off): y = bf16(max(x, 0)) in one pass, so the fp32
// output never reaches memory and the cast op's read of it disappears.
// The unfused twin is ReluOp (model/ops/relu.h) -> CastOp (model/ops/cast.h); fusion/cast_pass.cpp
// builds this op and tests/resnet_bf16_test.cpp checks the two agree bit for bit (the same max,
// rounded once).
// Backward is ReLU's, dx (+)= dy where y > 0, with the mask read from the bf16 y: rounding keeps
// the sign and maps no positive normal float to 0 (and the process flushes denormals to zero:
// core/denormals.h), so the mask is the fp32 one.
// On cuda (relu_cast.cu; compiled, not yet run on a GPU) the same element math runs as kernels.
// Inputs {x fp32 [numel]}, outputs {y bf16 [numel]}, no params.
// Thread safety: one training thread per op; loops are parallel with OpenMP.
#pragma once
#include <cstdint>

#include "core/device.h"
#include "core/hd.h"
#include "core/math/bf16_math.h"
#include "model/graph.h"
#include "model/ops/relu.h"

namespace ft {

// The element math of the CPU loops and the CUDA kernels: ReluOp's, then CastOp's rounding.
FT_HD bf16_bits relu_cast_value(float x) {
  return float_to_bf16(relu_value(x));
}
FT_HD float relu_cast_gradient(float dy, bf16_bits y) {
  return relu_gradient(dy, bf16_to_float(y));
}

// y = bf16(relu(x)).
void relu_cast_forward(bf16_bits* y, const float* x, int64_t numel);
// dx (+)= dy where y > 0, else nothing; `=` (0 where y <= 0) when dx_fresh.
void relu_cast_backward(float* dx, const float* dy, const bf16_bits* y, int64_t numel,
                        bool dx_fresh);
// The same on device pointers, enqueued on `stream` (relu_cast.cu; CUDA builds only).
void relu_cast_forward_cuda(bf16_bits* y, const float* x, int64_t numel, CudaStream stream);
void relu_cast_backward_cuda(float* dx, const float* dy, const bf16_bits* y, int64_t numel,
                             bool dx_fresh, CudaStream stream);

class ReluCastOp : public Op {
 public:
  explicit ReluCastOp(int64_t numel);
  OpKind op_kind() const override { return OpKind::kReluCast; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool overwrites_fresh_input_grads() const override { return true; }
  bool handles_bf16() const override { return true; }
  OpCost cost(const Graph& graph) const override;

 private:
  int64_t numel_;
};

}  // namespace ft

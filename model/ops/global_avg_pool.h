// GlobalAvgPoolOp: the mean of each channel over the spatial positions of channels-last (NHWC)
// activations, y[b,c] = 1/(H W) sum_{h,w} x[b,h,w,c].
// Inputs {x [B,H,W,C]}, outputs {y [B,C]}, no params.
// Thread safety: one training thread per op; loops are parallel over the batch with OpenMP.
#pragma once
#include <cstdint>

#include "core/device.h"
#include "model/graph.h"

namespace ft {

// y[b, c] = mean over `positions` of x[b, p, c], and dx[b, p, c] += dy[b, c] / positions, on
// device pointers enqueued on `stream` (global_avg_pool.cu; CUDA builds only).
void global_avg_pool_forward_cuda(float* y, const float* x, int batch, int64_t positions,
                                  int channels, CudaStream stream);
void global_avg_pool_backward_cuda(float* dx, const float* dy, int batch, int64_t positions,
                                   int channels, CudaStream stream);

class GlobalAvgPoolOp : public Op {
 public:
  GlobalAvgPoolOp(int batch, int channels, int height, int width);

  OpKind op_kind() const override { return OpKind::kGlobalAvgPool; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  OpCost cost(const Graph& graph) const override;

 private:
  int batch_, channels_, height_, width_;
};

}  // namespace ft

// GlobalAvgPoolOp: the mean of each channel over the spatial positions of channels-last (NHWC)
// activations, y[b,c] = 1/(H W) sum_{h,w} x[b,h,w,c].
// Inputs {x [B,H,W,C]}, outputs {y [B,C]}, no params.
// Thread safety: one training thread per op; loops are parallel over the batch with OpenMP.
#pragma once
#include "model/graph.h"

namespace ft {

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

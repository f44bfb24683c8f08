// count LayerNorms in one launch. Their rows are independent in forward and in the input
// gradient, so one parallel loop covers all of them (per-head LNs of hd = 32 columns are too
// small to parallelise one by one); the parameter gradients reduce over rows and run serially.
// On one thread backward makes a single pass, both gradients per row.
#include "fusion/ops/batched_layernorm.h"

#include <omp.h>

#include "core/check.h"
#include "kernels/layernorm.h"
#include "kernels/layernorm_math.h"
#include "model/ops/op_checks.h"

namespace ft {
BatchedLayerNormOp::BatchedLayerNormOp(int64_t rows, int64_t channels, int count)
    : rows_(rows), channels_(channels), count_(count) {
  FT_CHECK(rows > 0 && channels > 0 && count > 0,
           "BatchedLayerNormOp: non-positive shape rows=", rows, " channels=", channels,
           " count=", count);
}

void BatchedLayerNormOp::check_wiring(const Workspace& ws, const ParamStore& params) const {
  expect_arity(*this, count_, count_, 2 * static_cast<size_t>(count_));
  for (int n = 0; n < count_; ++n) {
    expect_numel(ws.values[inputs[n]], rows_ * channels_, *this, "input x");
    expect_numel(ws.values[outputs[n]], rows_ * channels_, *this, "output y");
    expect_numel(params[this->params[2 * n]].value, channels_, *this, "weight");
    expect_numel(params[this->params[2 * n + 1]].value, channels_, *this, "bias");
  }
}

void BatchedLayerNormOp::forward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  reuse_or_allocate(mean_, count_ * rows_, ws.device);
  reuse_or_allocate(rstd_, count_ * rows_, ws.device);
  FT_RUN_ON_CUDA(ws, forward_cuda(ws, params));
  std::vector<float*> y(count_);
  std::vector<const float*> x(count_), weight(count_), bias(count_);
  std::vector<int64_t> y_stride(count_), x_stride(count_);
  for (int n = 0; n < count_; ++n) {
    y[n] = ws.values[outputs[n]].data();
    x[n] = ws.values[inputs[n]].data();
    weight[n] = params[this->params[2 * n]].value.data();
    bias[n] = params[this->params[2 * n + 1]].value.data();
    y_stride[n] = ws.row_stride(outputs[n]);
    x_stride[n] = ws.row_stride(inputs[n]);
  }
  const int count = count_;
  const int64_t rows = rows_, channels = channels_;
  float* mean = mean_.data();
  float* rstd = rstd_.data();
#pragma omp parallel for collapse(2) if (count * rows * channels > 65536)
  for (int n = 0; n < count; ++n)
    for (int64_t row = 0; row < rows; ++row)
      layernorm_row_forward(y[n] + row * y_stride[n], mean + n * rows + row, rstd + n * rows + row,
                            x[n] + row * x_stride[n], weight[n], bias[n], channels, kLayerNormEps);
}

void BatchedLayerNormOp::backward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  FT_CHECK(mean_.numel() == count_ * rows_ && mean_.device() == ws.device, kind(), " '", name,
           "': backward before forward");
  FT_RUN_ON_CUDA(ws, backward_cuda(ws, params));
  std::vector<float*> dx(count_), dweight(count_), dbias(count_);
  std::vector<const float*> dy(count_), x(count_), weight(count_);
  std::vector<int64_t> dy_stride(count_), x_stride(count_);
  for (int n = 0; n < count_; ++n) {
    dx[n] = ws.grads[inputs[n]].data();
    dy[n] = ws.grads[outputs[n]].data();
    x[n] = ws.values[inputs[n]].data();
    weight[n] = params[this->params[2 * n]].value.data();
    dweight[n] = params[this->params[2 * n]].grad.data();
    dbias[n] = params[this->params[2 * n + 1]].grad.data();
    dy_stride[n] = ws.row_stride(outputs[n]);
    x_stride[n] = ws.row_stride(inputs[n]);  // dx shares x's stride
  }
  const int count = count_;
  const int64_t rows = rows_, channels = channels_;
  const float* mean = mean_.data();
  const float* rstd = rstd_.data();
  // Parameter sums go LayerNorm by LayerNorm in reverse: the executor runs the unfused per-head
  // LayerNorms' backward last op first, and a shared weight's float sums must be added in that
  // same order to match it bit for bit.
  auto add_param_grads = [&](int n, int64_t row) {
    layernorm_row_backward_params(dweight[n], dbias[n], dy[n] + row * dy_stride[n],
                                  x[n] + row * x_stride[n], mean[n * rows + row],
                                  rstd[n * rows + row], channels);
  };
  auto add_input_grad = [&](int n, int64_t row) {
    layernorm_row_backward_input(dx[n] + row * x_stride[n], dy[n] + row * dy_stride[n],
                                 x[n] + row * x_stride[n], weight[n], mean[n * rows + row],
                                 rstd[n * rows + row], channels);
  };
  if (count * rows * channels <= 65536 || omp_get_max_threads() == 1) {
    // One thread: both gradients of a row while its dy and x are in cache (at gpt_small a
    // second pass over all 16 heads would re-read ~5 MB of dy and qkv, more than L2 holds).
    for (int n = count - 1; n >= 0; --n)
      for (int64_t row = 0; row < rows; ++row) {
        add_input_grad(n, row);
        add_param_grads(n, row);
      }
    return;
  }
  // Rows are independent for dx: one parallel loop over all of them. The parameter sums reduce
  // over rows and stay serial, in the order above.
#pragma omp parallel for collapse(2)
  for (int n = 0; n < count; ++n)
    for (int64_t row = 0; row < rows; ++row) add_input_grad(n, row);
  for (int n = count - 1; n >= 0; --n)
    for (int64_t row = 0; row < rows; ++row) add_param_grads(n, row);
}

#if defined(FT_HAVE_CUDA)
// The same table the CPU loops walk, as kernels/layernorm.cu's launch entries.
void BatchedLayerNormOp::forward_cuda(Workspace& ws, ParamStore& params) {
  std::vector<LayerNormCudaTensors> norms(count_);
  for (int n = 0; n < count_; ++n) {
    norms[n].y = ws.values[outputs[n]].data();
    norms[n].x = ws.values[inputs[n]].data();
    norms[n].weight = params[this->params[2 * n]].value.data();
    norms[n].bias = params[this->params[2 * n + 1]].value.data();
    norms[n].y_stride = ws.row_stride(outputs[n]);
    norms[n].x_stride = ws.row_stride(inputs[n]);
  }
  layernorm_batch_forward_cuda(mean_.data(), rstd_.data(), norms.data(), count_, rows_, channels_,
                               ws.stream);
}

void BatchedLayerNormOp::backward_cuda(Workspace& ws, ParamStore& params) {
  std::vector<LayerNormCudaTensors> norms(count_);
  for (int n = 0; n < count_; ++n) {
    norms[n].dx = ws.grads[inputs[n]].data();
    norms[n].dweight = params[this->params[2 * n]].grad.data();
    norms[n].dbias = params[this->params[2 * n + 1]].grad.data();
    norms[n].dy = ws.grads[outputs[n]].data();
    norms[n].x = ws.values[inputs[n]].data();
    norms[n].weight = params[this->params[2 * n]].value.data();
    norms[n].y_stride = ws.row_stride(outputs[n]);  // dy shares y's stride, dx x's
    norms[n].x_stride = ws.row_stride(inputs[n]);
  }
  reuse_or_allocate(param_grad_scratch_, layernorm_params_scratch_floats(count_, rows_, channels_),
                    ws.device);
  layernorm_batch_backward_input_cuda(norms.data(), mean_.data(), rstd_.data(), count_, rows_,
                                      channels_, ws.stream);
  layernorm_batch_backward_params_cuda(param_grad_scratch_.data(), norms.data(), mean_.data(),
                                       rstd_.data(), count_, rows_, channels_, ws.stream);
}
#endif  // defined(FT_HAVE_CUDA)

OpCost BatchedLayerNormOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double elements = static_cast<double>(count_) * rows_ * channels_;
  cost.forward_flops = 8 * elements;  // as LayerNormOp, count times
  cost.backward_flops = 14 * elements;
  cost.bytes_read += 8.0 * channels_ * count_;
  cost.saved_bytes = 8.0 * rows_ * count_;
  return cost;
}

}  // namespace ft

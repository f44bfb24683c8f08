// Fully connected layer, nn.Linear layout: y[rows, out] = x[rows, in] · W[out, in]^T + b[out].
// Inputs {x}, outputs {y} (either may be a column view), params {weight, bias when has_bias}.
// The op may use a row range of its parameters: rows [weight_row_offset, +out) of a weight with
// `in` columns and the same entries of the bias. That is how the eager GPT graph runs q, k and v
// as three Linears over the one [3C, C] c_attn.weight, so checkpoints never change layout.
// The free functions are the math; LinearOp wires them to a graph. Fusions reuse the functions.
// On cuda every op of the family runs the *_cuda launchers on ws.stream.
// Thread safety: an op instance belongs to one training thread (gemm runs on oneDNN's pool).
#pragma once
#include <cstdint>

#include "core/gemm.h"
#include "model/graph.h"

namespace ft {

// y = x W^T + b. `bias` may be null. Strides are floats between rows (0 = packed).
void linear_forward(float* y, const float* x, const float* weight, const float* bias, int64_t rows,
                    int64_t in_features, int64_t out_features, int64_t y_stride = 0,
                    int64_t x_stride = 0);
// dx += dy W (dx = dy W when overwrite_dx); dweight += dy^T x; dbias += colsum(dy). `dx` and
// `dbias` may be null (skipped). dx shares x's stride, dy y's.
void linear_backward(float* dx, bool overwrite_dx, float* dweight, float* dbias, const float* dy,
                     const float* x, const float* weight, int64_t rows, int64_t in_features,
                     int64_t out_features, int64_t dy_stride = 0, int64_t x_stride = 0);
// The same on device pointers, enqueued on `stream` (linear.cu; CUDA builds only): the GEMMs run
// through gemm_cuda (bias fused into cuBLASLt's epilogue), db += colsum(dy) is a column-sum
// kernel (cuBLASLt's bias-gradient epilogue writes (=) and parameter gradients must add (+=)).
// Forward takes x and weight fp32, or both bf16 (train.precision: bf16).
void linear_forward_cuda(float* y, GemmOperand x, GemmOperand weight, const float* bias,
                         int64_t rows, int64_t in_features, int64_t out_features, int64_t y_stride,
                         int64_t x_stride, CudaStream stream);
void linear_backward_cuda(float* dx, bool overwrite_dx, float* dweight, float* dbias,
                          const float* dy, const float* x, const float* weight, int64_t rows,
                          int64_t in_features, int64_t out_features, int64_t dy_stride,
                          int64_t x_stride, CudaStream stream);

// The three GEMMs of a Linear, the same for the oneDNN and the cuBLASLt kernels:
//   y = x W^T (+ b)        [rows, in] · [out, in]^T
//   dx += dy W             [rows, out] · [out, in]   (= with overwrite_dx)
//   dW += dy^T x           [out, rows] · [rows, in]  (dy stored [rows, out] = [K, M])
// Strides as above; 0 = packed.
GemmArgs linear_forward_gemm(int64_t rows, int64_t in_features, int64_t out_features,
                             const float* bias, int64_t y_stride, int64_t x_stride);
GemmArgs linear_dx_gemm(int64_t rows, int64_t in_features, int64_t out_features, int64_t dy_stride,
                        int64_t x_stride, bool overwrite_dx = false);
GemmArgs linear_dweight_gemm(int64_t rows, int64_t in_features, int64_t out_features,
                             int64_t dy_stride, int64_t x_stride);

// Mixed precision (train.precision: bf16), for every op whose GEMM reads x: when x is a bf16
// value, the weight operand is the parameter's bf16 copy (ParamStore::enable_bf16_copies) and
// backward multiplies a bf16 copy of dy. `offset` is in elements.
GemmOperand weight_operand(const Param& weight, int64_t offset, DType x_dtype);
GemmOperand value_operand(const Tensor& value);
// dy [rows, cols] (row stride dy_stride) rounded into a packed bf16 scratch buffer owned by the
// calling thread; valid until the next call.
const bf16_bits* bf16_gradient_copy(const float* dy, int64_t rows, int64_t cols, int64_t dy_stride);
// The CUDA twin (linear.cu; CUDA builds only): the same rounding (CastOp's kernel) enqueued on
// `stream` into a packed bf16 device buffer owned by the calling thread, grown as needed and
// never freed, so a training step after the first allocates nothing and a captured CUDA graph
// keeps a valid address. Valid until the next call's kernel runs: callers enqueue every reader
// of the copy on `stream` before calling again, so stream order keeps the readers ahead of the
// reuse.
const bf16_bits* bf16_gradient_copy_cuda(const float* dy, int64_t rows, int64_t cols,
                                         int64_t dy_stride, CudaStream stream);
// The bf16 form of linear_backward: x and weight bf16, dy fp32 (rounded once, above); dx, dweight
// and dbias fp32 as there (dbias sums the fp32 dy).
void linear_backward_bf16(float* dx, bool overwrite_dx, float* dweight, float* dbias,
                          const float* dy, const bf16_bits* x, const bf16_bits* weight,
                          int64_t rows, int64_t in_features, int64_t out_features,
                          int64_t dy_stride, int64_t x_stride);
// Its CUDA twin on device pointers, enqueued on `stream` (linear.cu; CUDA builds only).
void linear_backward_bf16_cuda(float* dx, bool overwrite_dx, float* dweight, float* dbias,
                               const float* dy, const bf16_bits* x, const bf16_bits* weight,
                               int64_t rows, int64_t in_features, int64_t out_features,
                               int64_t dy_stride, int64_t x_stride, CudaStream stream);

// Entry checks of the Linear op family (LinearOp, LinearGeluOp, QkvLinearOp): x [rows, in] in,
// y [rows, out] out, and params {weight, bias when has_bias} that hold the rows
// [weight_row_offset, weight_row_offset + out) the op uses.
void check_linear_wiring(const Op& op, const Workspace& ws, const ParamStore& params, int64_t rows,
                         int64_t in_features, int64_t out_features, bool has_bias,
                         int64_t weight_row_offset);
// linear_forward / linear_backward on an op's x, y and parameter rows (wired as above);
// backward skips dx when x has no gradient buffer and overwrites it when ws.grad_is_fresh(x), so
// every op of the family can return true from overwrites_fresh_input_grads().
void linear_op_forward(const Op& op, Workspace& ws, ParamStore& params, int64_t rows,
                       int64_t in_features, int64_t out_features, bool has_bias,
                       int64_t weight_row_offset);
void linear_op_backward(const Op& op, Workspace& ws, ParamStore& params, int64_t rows,
                        int64_t in_features, int64_t out_features, bool has_bias,
                        int64_t weight_row_offset);

class LinearOp : public Op {
 public:
  LinearOp(int64_t rows, int64_t in_features, int64_t out_features, bool has_bias,
           int64_t weight_row_offset = 0);
  OpKind op_kind() const override { return OpKind::kLinear; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool supports_views() const override { return true; }
  bool overwrites_fresh_input_grads() const override { return true; }
  bool handles_bf16() const override { return true; }
  OpCost cost(const Graph& graph) const override;

  int64_t rows() const { return rows_; }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  bool has_bias() const { return has_bias_; }
  int64_t weight_row_offset() const { return weight_row_offset_; }

 private:
  int64_t rows_, in_features_, out_features_;
  bool has_bias_;
  int64_t weight_row_offset_;
};

}  // namespace ft

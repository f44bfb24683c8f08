// Internal to Conv2dOp's CUDA path (conv2d.cu, conv2d_bf16.cu; CUDA builds only): the cuDNN
// descriptors of one convolution in one data type, and the three passes run on them through the
// ranked algorithm candidates of their ConvAlgoKey (model/ops/conv_algo_key.h). conv2d.cu runs
// them on fp32 operands, conv2d_bf16.cu on bf16 ones (cuDNN's PSEUDO_BFLOAT16_CONFIG).
// Thread safety: a CudnnConv belongs to its op's training thread.
#pragma once
#include <cudnn.h>

#include <memory>

#include "core/tensor.h"
#include "model/ops/conv2d.h"
#include "model/ops/conv_algo_key.h"

namespace ft {

// x, filter, y and convolution descriptors of one data type: all CUDNN_DATA_FLOAT, or (bf16) x,
// filter and y CUDNN_DATA_BFLOAT16 with an fp32 convolution (compute) type. The candidate
// pointers are their keys' entries of the process-wide cache, found on first use of each pass.
struct CudnnConvDescriptors {
  // REQUIRES: `shape` as cudnn_conv_shape makes it. Throws ft::Error when cuDNN refuses.
  CudnnConvDescriptors(const CudnnConvShape& shape, bool bf16);
  ~CudnnConvDescriptors();  // never throws: statuses are ignored
  CudnnConvDescriptors(const CudnnConvDescriptors&) = delete;
  CudnnConvDescriptors& operator=(const CudnnConvDescriptors&) = delete;

  bool bf16;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  ConvAlgoCandidates* forward = nullptr;
  ConvAlgoCandidates* backward_data = nullptr;
  ConvAlgoCandidates* backward_filter = nullptr;
};

struct CudnnConv {
  explicit CudnnConv(const CudnnConvShape& s) : shape(s), fp32(s, false) {}
  CudnnConvShape shape;
  CudnnConvDescriptors fp32;
  std::unique_ptr<CudnnConvDescriptors> bf16;  // made by the first bf16 pass
};

// cuDNN reads and writes every operand channels last (model/ops/conv2d_layout.h). A LayoutMove
// is the [outer][channels][inner] view that turns a result in cuDNN's layout into ours;
// channels == 1 when the two layouts are the same bytes (no move).
struct LayoutMove {
  int64_t outer, channels, inner;
  int64_t count() const { return outer * channels * inner; }
};
LayoutMove weight_from_krsc(const CudnnConvShape& shape);  // dW: KRSC -> OIHW
LayoutMove input_from_nhwc(const CudnnConvShape& shape);   // dx: NHWC -> ours (NCHW or NHWC)
// The operand as cuDNN reads it: `x` (`weight`) itself where our layout is already cuDNN's, else
// a transposed copy enqueued on `stream` into `scratch`, which must outlive the pass reading it.
// Elements are bf16_bits when `bf16`, else float.
const void* cudnn_input(const CudnnConvShape& shape, bool bf16, const void* x, Tensor& scratch,
                        CudaStream stream);
const void* cudnn_weight(const CudnnConvShape& shape, bool bf16, const void* weight,
                         Tensor& scratch, CudaStream stream);

// cuDNN's handle, bound to `stream`.
cudnnHandle_t cudnn_handle_on(CudaStream stream);

// The three passes on d's data type (pointers to elements of that type), enqueued on the
// handle's stream: out = op, or out += op when `accumulate` (cuDNN's beta = 1). A candidate cuDNN
// refuses at execution launches nothing, so the next one still sees the untouched output.
// y = conv(x, w)
void cudnn_conv_forward(CudnnConvDescriptors& d, const CudnnConvShape& shape, cudnnHandle_t handle,
                        const void* x, const void* w, void* y, bool accumulate);
// dw (+)= correlation of x with dy
void cudnn_conv_backward_filter(CudnnConvDescriptors& d, const CudnnConvShape& shape,
                                cudnnHandle_t handle, const void* x, const void* dy, void* dw,
                                bool accumulate);
// dx (+)= transposed convolution of dy with w
void cudnn_conv_backward_data(CudnnConvDescriptors& d, const CudnnConvShape& shape,
                              cudnnHandle_t handle, const void* w, const void* dy, void* dx,
                              bool accumulate);

}  // namespace ft

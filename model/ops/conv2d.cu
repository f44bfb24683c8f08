// Conv2dOp on cuDNN: forward, backward data and backward filter on our NHWC activations (the
// stem's input may be NCHW) and OIHW (KCRS) weights, fp32 throughout.
// Math mode: CUDNN_FMA_MATH. For float data CUDNN_DEFAULT_MATH permits TF32 tensor-core kernels
// on A100 and later (H200 included), which round the inputs to 10 mantissa bits; FMA_MATH is the
// mode that restricts cuDNN to fp32 FMA kernels, so results match the CPU's within fp32 rounding.
// Algorithms: cudnnFind* times every algorithm once per ConvAlgoKey (model/ops/conv_algo_key.h)
// and the fastest deterministic fp32 one is kept for every convolution of that shape; where Find
// cannot run (it allocates its own buffers, which may fail next to our caching allocator's),
// cudnnGet*_v7's heuristic ranking is used instead. Deterministic algorithms first: the
// atomics-based weight-gradient kernels would make two runs of one step differ.
// Accumulation: cuDNN computes alpha * op + beta * out, so beta = 1 gives the += of Op::backward
// (dx of a not-fresh gradient, dw always) with no scratch buffer, and beta = 0 overwrites without
// reading the output.
#include <cudnn.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_context.h"
#include "core/launch_counter.h"
#include "model/ops/conv2d.h"
#include "model/ops/conv_algo_key.h"

namespace ft {

struct CudnnConv {
  CudnnConvShape shape;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  // Chosen on first use of each pass: an eval graph's convolutions never search backward.
  bool forward_chosen = false, backward_chosen = false;
  ConvAlgoChoice forward, backward_data, backward_filter;

  ~CudnnConv() {  // never throws: statuses are ignored
    if (conv != nullptr) cudnnDestroyConvolutionDescriptor(conv);
    if (w != nullptr) cudnnDestroyFilterDescriptor(w);
    if (y != nullptr) cudnnDestroyTensorDescriptor(y);
    if (x != nullptr) cudnnDestroyTensorDescriptor(x);
  }
};

namespace {

ConvAlgoKey algo_key(const CudnnConvShape& s, ConvPass pass) {
  ConvAlgoKey key;
  key.n = s.batch;
  key.c = s.in_channels;
  key.h = s.height;
  key.w = s.width;
  key.k = s.out_channels;
  key.r = s.kernel;
  key.s = s.kernel;
  key.stride = s.stride;
  key.pad = s.padding;
  key.dilation = 1;
  key.nchw_input = s.nchw_input;
  key.pass = pass;
  return key;
}

// One process-wide cache: the key holds the whole shape, so equal convolutions share a search.
ConvAlgoCache& algo_cache() {
  static ConvAlgoCache cache;
  return cache;
}

// The first usable result (perf arrays come sorted fastest first): status SUCCESS and no tensor
// cores; deterministic before not, and results timed in FMA math before those reported as
// DEFAULT (the descriptor stays FMA_MATH, so cuDNN runs either without TF32).
template <typename Perf>
bool pick(const Perf* perf, int count, ConvAlgoChoice* choice) {
  for (int rank = 0; rank < 4; ++rank) {
    const bool want_deterministic = rank < 2, want_fma = rank % 2 == 0;
    for (int i = 0; i < count; ++i) {
      if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
      if (want_fma ? perf[i].mathType != CUDNN_FMA_MATH : perf[i].mathType != CUDNN_DEFAULT_MATH)
        continue;
      if (want_deterministic && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
      choice->algorithm = static_cast<int>(perf[i].algo);
      choice->workspace_bytes = perf[i].memory;
      return true;
    }
  }
  return false;
}

// Find (timed), else Get_v7 (heuristic); `find` and `get` fill perf and return cuDNN's status.
template <typename Perf, typename Find, typename Get>
ConvAlgoChoice choose(const ConvAlgoKey& key, Find&& find, Get&& get) {
  std::vector<Perf> perf(16);
  int count = 0;
  ConvAlgoChoice choice;
  const cudnnStatus_t found = find(static_cast<int>(perf.size()), &count, perf.data());
  // Find cudaMallocs its own buffers; one that fails (the whole search, or one algorithm's
  // workspace, reported as that entry's status) leaves cudaErrorMemoryAllocation as the
  // runtime's last error, which the next FT_CUDA_CHECK_LAUNCH would report against an unrelated
  // kernel. Launch errors before this point were all checked, so clearing it hides nothing.
  cudaGetLastError();
  if (found == CUDNN_STATUS_SUCCESS && pick(perf.data(), count, &choice)) return choice;
  count = 0;
  FT_CUDNN_CHECK(get(static_cast<int>(perf.size()), &count, perf.data()));
  FT_CHECK(pick(perf.data(), count, &choice), "conv2d: cuDNN offers no fp32 (FMA) algorithm for ",
           key.text());
  return choice;
}

cudnnHandle_t handle_on(CudaStream stream) {
  CudnnHandle& cudnn = cuda_context().cudnn();
  cudnn.set_stream(stream);
  return cudnn.get();
}

// Scratch for one call from the caching allocator; freed blocks go back to it, ordered on the
// one compute stream.
Tensor workspace_for(size_t bytes) {
  if (bytes == 0) return Tensor();
  return Tensor::empty({static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float))},
                       Device::kCuda);
}

void choose_forward(CudnnConv& c, cudnnHandle_t handle) {
  const ConvAlgoKey key = algo_key(c.shape, ConvPass::kForward);
  c.forward = algo_cache().get(key, [&](const ConvAlgoKey& k) {
    return choose<cudnnConvolutionFwdAlgoPerf_t>(
        k,
        [&](int requested, int* count, cudnnConvolutionFwdAlgoPerf_t* perf) {
          return cudnnFindConvolutionForwardAlgorithm(handle, c.x, c.w, c.conv, c.y, requested,
                                                      count, perf);
        },
        [&](int requested, int* count, cudnnConvolutionFwdAlgoPerf_t* perf) {
          return cudnnGetConvolutionForwardAlgorithm_v7(handle, c.x, c.w, c.conv, c.y, requested,
                                                        count, perf);
        });
  });
  c.forward_chosen = true;
}

void choose_backward(CudnnConv& c, cudnnHandle_t handle) {
  const ConvAlgoKey data_key = algo_key(c.shape, ConvPass::kBackwardData);
  c.backward_data = algo_cache().get(data_key, [&](const ConvAlgoKey& k) {
    return choose<cudnnConvolutionBwdDataAlgoPerf_t>(
        k,
        [&](int requested, int* count, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
          return cudnnFindConvolutionBackwardDataAlgorithm(handle, c.w, c.y, c.conv, c.x, requested,
                                                           count, perf);
        },
        [&](int requested, int* count, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
          return cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, c.w, c.y, c.conv, c.x,
                                                             requested, count, perf);
        });
  });
  const ConvAlgoKey filter_key = algo_key(c.shape, ConvPass::kBackwardFilter);
  c.backward_filter = algo_cache().get(filter_key, [&](const ConvAlgoKey& k) {
    return choose<cudnnConvolutionBwdFilterAlgoPerf_t>(
        k,
        [&](int requested, int* count, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
          return cudnnFindConvolutionBackwardFilterAlgorithm(handle, c.x, c.y, c.conv, c.w,
                                                             requested, count, perf);
        },
        [&](int requested, int* count, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
          return cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, c.x, c.y, c.conv, c.w,
                                                               requested, count, perf);
        });
  });
  c.backward_chosen = true;
}

}  // namespace

std::shared_ptr<CudnnConv> make_cudnn_conv(const CudnnConvShape& shape) {
  auto c = std::make_shared<CudnnConv>();
  c->shape = shape;
  FT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&c->x));
  FT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&c->y));
  FT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&c->w));
  FT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&c->conv));
  FT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(
      c->x, shape.nchw_input ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, shape.batch,
      shape.in_channels, shape.height, shape.width));
  FT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(c->y, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, shape.batch,
                                            shape.out_channels, shape.out_height, shape.out_width));
  // Our weights are [out, in, kh, kw], cuDNN's NCHW (KCRS) filter order.
  FT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(c->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                            shape.out_channels, shape.in_channels, shape.kernel,
                                            shape.kernel));
  // Cross-correlation: PyTorch's (and our CPU kernels') convolution does not flip the kernel.
  FT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(c->conv, shape.padding, shape.padding,
                                                 shape.stride, shape.stride, 1, 1,
                                                 CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  FT_CUDNN_CHECK(cudnnSetConvolutionMathType(c->conv, CUDNN_FMA_MATH));
  int n = 0, k = 0, h = 0, w = 0;
  FT_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(c->conv, c->x, c->w, &n, &k, &h, &w));
  FT_CHECK(
      n == shape.batch && k == shape.out_channels && h == shape.out_height && w == shape.out_width,
      "conv2d: cuDNN's output ", n, "x", k, "x", h, "x", w, " differs from ours ", shape.batch, "x",
      shape.out_channels, "x", shape.out_height, "x", shape.out_width);
  return c;
}

CudnnConv& Conv2dOp::cudnn_conv() {
  if (!cudnn_) cudnn_ = make_cudnn_conv(cudnn_shape());
  return *cudnn_;
}

void conv2d_forward_cuda(float* y, const float* x, const float* weight, CudnnConv& conv,
                         CudaStream stream) {
  const cudnnHandle_t handle = handle_on(stream);
  if (!conv.forward_chosen) choose_forward(conv, handle);
  Tensor workspace = workspace_for(conv.forward.workspace_bytes);
  const float one = 1.0f, zero = 0.0f;
  FT_CUDNN_CHECK(
      cudnnConvolutionForward(handle, &one, conv.x, x, conv.w, weight, conv.conv,
                              static_cast<cudnnConvolutionFwdAlgo_t>(conv.forward.algorithm),
                              workspace.data(), conv.forward.workspace_bytes, &zero, conv.y, y));
  count_launch(LaunchKind::kConvolution);
}

void conv2d_backward_cuda(float* dx, float* dweight, const float* dy, const float* x,
                          const float* weight, bool dx_fresh, CudnnConv& conv, CudaStream stream) {
  const cudnnHandle_t handle = handle_on(stream);
  if (!conv.backward_chosen) choose_backward(conv, handle);
  const size_t bytes = std::max(conv.backward_filter.workspace_bytes,
                                dx != nullptr ? conv.backward_data.workspace_bytes : size_t{0});
  Tensor workspace = workspace_for(bytes);
  const float one = 1.0f, zero = 0.0f;
  FT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
      handle, &one, conv.x, x, conv.y, dy, conv.conv,
      static_cast<cudnnConvolutionBwdFilterAlgo_t>(conv.backward_filter.algorithm),
      workspace.data(), conv.backward_filter.workspace_bytes, &one, conv.w, dweight));
  count_launch(LaunchKind::kConvolution);
  if (dx == nullptr) return;
  FT_CUDNN_CHECK(cudnnConvolutionBackwardData(
      handle, &one, conv.w, weight, conv.y, dy, conv.conv,
      static_cast<cudnnConvolutionBwdDataAlgo_t>(conv.backward_data.algorithm), workspace.data(),
      conv.backward_data.workspace_bytes, dx_fresh ? &zero : &one, conv.x, dx));
  count_launch(LaunchKind::kConvolution);
}

}  // namespace ft

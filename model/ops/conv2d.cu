// Conv2dOp on cuDNN: forward, backward data and backward filter on our NHWC activations (the
// stem's input may be NCHW) and OIHW (KCRS) weights. cuDNN sees every operand channels last (x
// NHWC, filter KRSC, y NHWC; model/ops/conv2d_layout.h says why): where ours differ, transposed
// copies go in and results come back transposed. This file runs the passes on fp32 operands and
// holds what both data types share (descriptors, layouts, algorithm choice, the passes);
// conv2d_bf16.cu runs them on bf16 operands (train.precision: bf16).
// Math mode: CUDNN_FMA_MATH for fp32. For float data CUDNN_DEFAULT_MATH permits TF32 tensor-core
// kernels on A100 and later (H200 included), which round the inputs to 10 mantissa bits; FMA_MATH
// is the mode that restricts cuDNN to fp32 FMA kernels, so results match the CPU's within fp32
// rounding. bf16 descriptors run under CUDNN_TENSOR_OP_MATH (ConvMath::kTensorOps): bf16
// products are exact in fp32, so tensor cores lose nothing there.
// Algorithms: per ConvAlgoKey (model/ops/conv_algo_key.h; the key includes the data type)
// cudnnFind* times every algorithm once and cudnnGet*_v7 ranks them by heuristic (Find allocates
// its own buffers, which may fail next to our caching allocator's; then only Get's list is left);
// the two lists make one ranked list of candidates (fp32: FMA ones only), deterministic first (the
// atomics-based weight-gradient kernels would make two runs of one step differ), and only
// deterministic ones under set_deterministic_algorithms. A candidate cuDNN refuses at execution
// (NOT_SUPPORTED, e.g. one timed under default math that exists only as a TF32 engine under FMA
// math) gives way to the next; the one that ran is kept for the key and logged once on stderr
// (rank 0).
// Accumulation: cuDNN computes alpha * op + beta * out, so beta = 1 gives the += of Op::backward
// (dx of a not-fresh gradient, dw always) where cuDNN writes our buffer itself, and beta = 0
// overwrites without reading it. A result that comes back through a scratch in cuDNN's layout
// (a KRSC dW, the NHWC dx of an NCHW input) is written there with beta = 0 and added (or
// written) into ours by the transpose.
#include <cudnn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_context.h"
#include "core/determinism.h"
#include "core/launch_counter.h"
#include "model/ops/conv2d.h"
#include "model/ops/conv2d_cudnn.h"
#include "model/ops/conv2d_layout.h"
#include "model/ops/conv_algo_key.h"

namespace ft {
namespace {

ConvAlgoKey algo_key(const CudnnConvShape& s, bool bf16, ConvPass pass) {
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
  key.bf16 = bf16;
  key.pass = pass;
  return key;
}

// Process-wide caches, one per determinism setting: the key holds the whole shape, so equal
// convolutions share a search.
ConvAlgoCache& algo_cache() {
  static ConvAlgoCache caches[2];
  return caches[deterministic_algorithms() ? 1 : 0];
}

template <typename Perf>
std::vector<ConvAlgoReport> reports(const std::vector<Perf>& perf, int count) {
  std::vector<ConvAlgoReport> out;
  for (int i = 0; i < count && i < static_cast<int>(perf.size()); ++i) {
    ConvAlgoReport report;
    report.algorithm = static_cast<int>(perf[i].algo);
    report.usable = perf[i].status == CUDNN_STATUS_SUCCESS;
    report.fma_math = perf[i].mathType == CUDNN_FMA_MATH;
    report.default_math = perf[i].mathType == CUDNN_DEFAULT_MATH;
    report.deterministic = perf[i].determinism == CUDNN_DETERMINISTIC;
    report.workspace_bytes = perf[i].memory;
    out.push_back(report);
  }
  return out;
}

// What cuDNN said of each algorithm, for the error when none is usable: "1: NOT_SUPPORTED, FMA
// math, deterministic".
template <typename Perf>
std::string perf_text(const std::vector<Perf>& perf, int count) {
  std::string text;
  for (int i = 0; i < count && i < static_cast<int>(perf.size()); ++i) {
    const char* math = perf[i].mathType == CUDNN_FMA_MATH       ? "FMA"
                       : perf[i].mathType == CUDNN_DEFAULT_MATH ? "default"
                                                                : "tensor-op";
    text += (text.empty() ? "" : "; ") + std::to_string(static_cast<int>(perf[i].algo)) + ": " +
            cudnnGetErrorString(perf[i].status) + ", " + math + " math, " +
            (perf[i].determinism == CUDNN_DETERMINISTIC ? "deterministic" : "not deterministic");
  }
  return text.empty() ? "none" : text;
}

// Find (timed) and Get_v7 (heuristic), ranked into one list; `find` and `get` fill perf and
// return cuDNN's status.
template <typename Perf, typename Find, typename Get>
std::vector<ConvAlgoChoice> candidates(const ConvAlgoKey& key, Find&& find, Get&& get) {
  std::vector<Perf> perf(16);
  int count = 0;
  const cudnnStatus_t found = find(static_cast<int>(perf.size()), &count, perf.data());
  // Find cudaMallocs its own buffers; one that fails (the whole search, or one algorithm's
  // workspace, reported as that entry's status) leaves cudaErrorMemoryAllocation as the
  // runtime's last error, which the next FT_CUDA_CHECK_LAUNCH would report against an unrelated
  // kernel. Launch errors before this point were all checked, so clearing it hides nothing.
  cudaGetLastError();
  const std::vector<ConvAlgoReport> searched =
      found == CUDNN_STATUS_SUCCESS ? reports(perf, count) : std::vector<ConvAlgoReport>();
  const std::string search_text = found == CUDNN_STATUS_SUCCESS
                                      ? perf_text(perf, count)
                                      : std::string("failed: ") + cudnnGetErrorString(found);
  count = 0;
  FT_CUDNN_CHECK(get(static_cast<int>(perf.size()), &count, perf.data()));
  std::vector<ConvAlgoChoice> ranked =
      rank_conv_algorithms(searched, reports(perf, count), deterministic_algorithms(),
                           key.bf16 ? ConvMath::kTensorOps : ConvMath::kFma);
  FT_CHECK(!ranked.empty(), "conv2d: cuDNN offers no ",
           deterministic_algorithms() ? "deterministic " : "", key.bf16 ? "bf16" : "fp32 (FMA)",
           " algorithm for ", key.text(), " (search: ", search_text,
           "; heuristic: ", perf_text(perf, count), ")");
  return ranked;
}

void log_choice(const std::string& line) {
  const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (world_rank == nullptr || std::atoi(world_rank) == 0)
    std::fprintf(stderr, "cudnn: %s\n", line.c_str());
}

// A refusal at execution moves to the next candidate; every other failure throws.
ConvAttempt attempt_status(cudnnStatus_t status, const char* call) {
  if (status == CUDNN_STATUS_NOT_SUPPORTED) return ConvAttempt::kNotSupported;
  if (status != CUDNN_STATUS_SUCCESS)
    throw Error(cuda_error_message(CudaLibrary::kCudnn, status, call, __FILE__, __LINE__));
  return ConvAttempt::kRan;
}

// Scratch for one call from the caching allocator; freed blocks go back to it, ordered on the
// one compute stream.
Tensor workspace_for(size_t bytes) {
  if (bytes == 0) return Tensor();
  return Tensor::empty({static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float))},
                       Device::kCuda);
}

void choose_forward(CudnnConvDescriptors& c, const CudnnConvShape& shape, cudnnHandle_t handle) {
  const ConvAlgoKey key = algo_key(shape, c.bf16, ConvPass::kForward);
  c.forward = &algo_cache().get(key, [&](const ConvAlgoKey& k) {
    return candidates<cudnnConvolutionFwdAlgoPerf_t>(
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
}

void choose_backward_data(CudnnConvDescriptors& c, const CudnnConvShape& shape,
                          cudnnHandle_t handle) {
  const ConvAlgoKey key = algo_key(shape, c.bf16, ConvPass::kBackwardData);
  c.backward_data = &algo_cache().get(key, [&](const ConvAlgoKey& k) {
    return candidates<cudnnConvolutionBwdDataAlgoPerf_t>(
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
}

void choose_backward_filter(CudnnConvDescriptors& c, const CudnnConvShape& shape,
                            cudnnHandle_t handle) {
  const ConvAlgoKey key = algo_key(shape, c.bf16, ConvPass::kBackwardFilter);
  c.backward_filter = &algo_cache().get(key, [&](const ConvAlgoKey& k) {
    return candidates<cudnnConvolutionBwdFilterAlgoPerf_t>(
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
}

}  // namespace

cudnnHandle_t cudnn_handle_on(CudaStream stream) {
  CudnnHandle& cudnn = cuda_context().cudnn();
  cudnn.set_stream(stream);
  return cudnn.get();
}

CudnnConvDescriptors::CudnnConvDescriptors(const CudnnConvShape& shape, bool bf16_operands)
    : bf16(bf16_operands) {
  const cudnnDataType_t data = bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  FT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
  FT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
  FT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
  FT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
  // Channels last throughout (conv2d_layout.h): the passes hand cuDNN NHWC copies of NCHW
  // inputs and KRSC copies of OIHW weights.
  FT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NHWC, data, shape.batch,
                                            shape.in_channels, shape.height, shape.width));
  FT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NHWC, data, shape.batch,
                                            shape.out_channels, shape.out_height, shape.out_width));
  FT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, data, CUDNN_TENSOR_NHWC, shape.out_channels,
                                            shape.in_channels, shape.kernel, shape.kernel));
  // Cross-correlation: PyTorch's (and our CPU kernels') convolution does not flip the kernel.
  // The compute type is fp32 for both data types (bf16: PSEUDO_BFLOAT16_CONFIG).
  FT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, shape.padding, shape.padding, shape.stride,
                                                 shape.stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                                 CUDNN_DATA_FLOAT));
  FT_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, bf16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
  int n = 0, k = 0, h = 0, width = 0;
  FT_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv, x, w, &n, &k, &h, &width));
  FT_CHECK(n == shape.batch && k == shape.out_channels && h == shape.out_height &&
               width == shape.out_width,
           "conv2d: cuDNN's output ", n, "x", k, "x", h, "x", width, " differs from ours ",
           shape.batch, "x", shape.out_channels, "x", shape.out_height, "x", shape.out_width);
}

CudnnConvDescriptors::~CudnnConvDescriptors() {
  if (conv != nullptr) cudnnDestroyConvolutionDescriptor(conv);
  if (w != nullptr) cudnnDestroyFilterDescriptor(w);
  if (y != nullptr) cudnnDestroyTensorDescriptor(y);
  if (x != nullptr) cudnnDestroyTensorDescriptor(x);
}

LayoutMove weight_from_krsc(const CudnnConvShape& shape) {
  // A 1x1 kernel's or a one-channel filter's OIHW is its KRSC.
  if (shape.kernel == 1 || shape.in_channels == 1)
    return {
        1, 1,
        static_cast<int64_t>(shape.out_channels) * shape.in_channels * shape.kernel * shape.kernel};
  return {shape.out_channels, shape.in_channels, static_cast<int64_t>(shape.kernel) * shape.kernel};
}

LayoutMove input_from_nhwc(const CudnnConvShape& shape) {
  const int64_t pixels = static_cast<int64_t>(shape.height) * shape.width;
  if (!shape.nchw_input) return {1, 1, shape.batch * pixels * shape.in_channels};
  return {shape.batch, shape.in_channels, pixels};
}

namespace {

template <typename T>
const void* channels_last_copy(const void* ours, const LayoutMove& move, Tensor& scratch,
                               CudaStream stream) {
  if (move.channels == 1) return ours;
  const bool bf16 = std::is_same<T, bf16_bits>::value;
  scratch = Tensor::empty({move.outer * move.channels * move.inner}, Device::kCuda,
                          bf16 ? DType::kBF16 : DType::kF32);
  T* copy = static_cast<T*>(bf16 ? static_cast<void*>(scratch.bf16_data()) : scratch.data());
  cuda_to_channels_last(copy, static_cast<const T*>(ours), move.outer, move.channels, move.inner,
                        stream);
  return copy;
}

}  // namespace

const void* cudnn_input(const CudnnConvShape& shape, bool bf16, const void* x, Tensor& scratch,
                        CudaStream stream) {
  const LayoutMove move = input_from_nhwc(shape);
  return bf16 ? channels_last_copy<bf16_bits>(x, move, scratch, stream)
              : channels_last_copy<float>(x, move, scratch, stream);
}

const void* cudnn_weight(const CudnnConvShape& shape, bool bf16, const void* weight,
                         Tensor& scratch, CudaStream stream) {
  const LayoutMove move = weight_from_krsc(shape);
  return bf16 ? channels_last_copy<bf16_bits>(weight, move, scratch, stream)
              : channels_last_copy<float>(weight, move, scratch, stream);
}

std::shared_ptr<CudnnConv> make_cudnn_conv(const CudnnConvShape& shape) {
  return std::make_shared<CudnnConv>(shape);
}

CudnnConv& Conv2dOp::cudnn_conv() {
  if (!cudnn_) cudnn_ = make_cudnn_conv(cudnn_shape());
  return *cudnn_;
}

void cudnn_conv_forward(CudnnConvDescriptors& d, const CudnnConvShape& shape, cudnnHandle_t handle,
                        const void* x, const void* w, void* y, bool accumulate) {
  if (d.forward == nullptr) choose_forward(d, shape, handle);
  const float one = 1.0f, zero = 0.0f;
  run_first_supported(
      *d.forward, algo_key(shape, d.bf16, ConvPass::kForward),
      [&](const ConvAlgoChoice& choice) {
        Tensor workspace = workspace_for(choice.workspace_bytes);
        return attempt_status(
            cudnnConvolutionForward(handle, &one, d.x, x, d.w, w, d.conv,
                                    static_cast<cudnnConvolutionFwdAlgo_t>(choice.algorithm),
                                    workspace.data(), choice.workspace_bytes,
                                    accumulate ? &one : &zero, d.y, y),
            "cudnnConvolutionForward");
      },
      log_choice);
  count_launch(LaunchKind::kConvolution);
}

void cudnn_conv_backward_filter(CudnnConvDescriptors& d, const CudnnConvShape& shape,
                                cudnnHandle_t handle, const void* x, const void* dy, void* dw,
                                bool accumulate) {
  if (d.backward_filter == nullptr) choose_backward_filter(d, shape, handle);
  const float one = 1.0f, zero = 0.0f;
  run_first_supported(
      *d.backward_filter, algo_key(shape, d.bf16, ConvPass::kBackwardFilter),
      [&](const ConvAlgoChoice& choice) {
        Tensor workspace = workspace_for(choice.workspace_bytes);
        return attempt_status(
            cudnnConvolutionBackwardFilter(
                handle, &one, d.x, x, d.y, dy, d.conv,
                static_cast<cudnnConvolutionBwdFilterAlgo_t>(choice.algorithm), workspace.data(),
                choice.workspace_bytes, accumulate ? &one : &zero, d.w, dw),
            "cudnnConvolutionBackwardFilter");
      },
      log_choice);
  count_launch(LaunchKind::kConvolution);
}

void cudnn_conv_backward_data(CudnnConvDescriptors& d, const CudnnConvShape& shape,
                              cudnnHandle_t handle, const void* w, const void* dy, void* dx,
                              bool accumulate) {
  if (d.backward_data == nullptr) choose_backward_data(d, shape, handle);
  const float one = 1.0f, zero = 0.0f;
  run_first_supported(
      *d.backward_data, algo_key(shape, d.bf16, ConvPass::kBackwardData),
      [&](const ConvAlgoChoice& choice) {
        Tensor workspace = workspace_for(choice.workspace_bytes);
        return attempt_status(
            cudnnConvolutionBackwardData(
                handle, &one, d.w, w, d.y, dy, d.conv,
                static_cast<cudnnConvolutionBwdDataAlgo_t>(choice.algorithm), workspace.data(),
                choice.workspace_bytes, accumulate ? &one : &zero, d.x, dx),
            "cudnnConvolutionBackwardData");
      },
      log_choice);
  count_launch(LaunchKind::kConvolution);
}

void conv2d_forward_cuda(float* y, const float* x, const float* weight, CudnnConv& conv,
                         CudaStream stream) {
  Tensor x_copy, weight_copy;
  cudnn_conv_forward(conv.fp32, conv.shape, cudnn_handle_on(stream),
                     cudnn_input(conv.shape, false, x, x_copy, stream),
                     cudnn_weight(conv.shape, false, weight, weight_copy, stream), y,
                     /*accumulate=*/false);
}

// dweight always accumulates; dx when the gradient is not fresh. A result in cuDNN's layout
// (KRSC dW, NHWC dx of an NCHW input) goes through a scratch and is transposed into ours.
void conv2d_backward_cuda(float* dx, float* dweight, const float* dy, const float* x,
                          const float* weight, bool dx_fresh, CudnnConv& conv, CudaStream stream) {
  const CudnnConvShape& s = conv.shape;
  const cudnnHandle_t handle = cudnn_handle_on(stream);
  Tensor x_copy;
  const void* cudnn_x = cudnn_input(s, false, x, x_copy, stream);
  const LayoutMove dweight_move = weight_from_krsc(s);
  if (dweight_move.channels == 1) {
    cudnn_conv_backward_filter(conv.fp32, s, handle, cudnn_x, dy, dweight, /*accumulate=*/true);
  } else {
    Tensor krsc = Tensor::empty({dweight_move.count()}, Device::kCuda);
    cudnn_conv_backward_filter(conv.fp32, s, handle, cudnn_x, dy, krsc.data(),
                               /*accumulate=*/false);
    cuda_from_channels_last(dweight, krsc.data(), dweight_move.outer, dweight_move.channels,
                            dweight_move.inner, /*accumulate=*/true, stream);
  }
  if (dx == nullptr) return;
  Tensor weight_copy;
  const void* cudnn_w = cudnn_weight(s, false, weight, weight_copy, stream);
  const LayoutMove dx_move = input_from_nhwc(s);
  if (dx_move.channels == 1)
    return cudnn_conv_backward_data(conv.fp32, s, handle, cudnn_w, dy, dx, !dx_fresh);
  Tensor nhwc = Tensor::empty({dx_move.count()}, Device::kCuda);
  cudnn_conv_backward_data(conv.fp32, s, handle, cudnn_w, dy, nhwc.data(), /*accumulate=*/false);
  cuda_from_channels_last(dx, nhwc.data(), dx_move.outer, dx_move.channels, dx_move.inner,
                          !dx_fresh, stream);
}

}  // namespace ft

// The per-tensor sweep's kernels on CUDA (optimizer.h): one launch per tensor and pass, over
// the helpers of kernels/optimizer_math.h that the CPU range kernels also call, then the
// gradient norm's final reduction, which fusion/multi_tensor.cu shares.
#include "core/capture_guard.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "kernels/optimizer.h"
#include "kernels/optimizer_math.h"
#include "kernels/step_control.h"

namespace ft {
namespace {

// With a control (a CUDA-graph step, kernels/step_control.h) the constants, the clip scale and the
// skip decision come from device memory; without one, from the arguments. The scaled gradient is
// __fmul_rn: a plain product may be contracted into the FMA of sgd_element's grad + decay * value,
// which rounds once where the eager step (clipped in place, then read) rounds twice.
__global__ void adamw_update_kernel(float* value, float* exp_avg, float* exp_avg_sq,
                                    const float* grad, int64_t count, AdamWStep step,
                                    bool weight_decay, const DeviceStepControl* control) {
  float grad_scale = 1.0f;
  if (!apply_step_control(control, &step, &grad_scale)) return;
  const float decay = weight_decay ? step.decay : 0.0f;
  FT_GRID_STRIDE_LOOP(i, count) {
    adamw_element(value[i], exp_avg[i], exp_avg_sq[i], __fmul_rn(grad[i], grad_scale), step, decay);
  }
}

__global__ void sgd_update_kernel(float* value, float* momentum_buffer, const float* grad,
                                  int64_t count, SgdStep step, bool weight_decay,
                                  const DeviceStepControl* control) {
  float grad_scale = 1.0f;
  if (!apply_step_control(control, &step, &grad_scale)) return;
  const float decay = weight_decay ? step.weight_decay : 0.0f;
  FT_GRID_STRIDE_LOOP(i, count) {
    sgd_element(value[i], momentum_buffer[i], __fmul_rn(grad[i], grad_scale), step, decay);
  }
}

__global__ void finish_step_control_kernel(DeviceStepControl* control, const float* loss) {
  control->loss = *loss;
  finish_step_control(*control);
}

__global__ void scale_kernel(float* data, int64_t count, float scale) {
  FT_GRID_STRIDE_LOOP(i, count) {
    data[i] *= scale;
  }
}

// Block c sums the squares of the tensor's chunk c, as fusion/multi_tensor.cu's blocks do.
__global__ void square_sum_partials_kernel(double* partials, const float* data, int64_t count) {
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kSweepChunk;
  const int64_t chunk = count - begin < kSweepChunk ? count - begin : kSweepChunk;
  const double sum = block_square_sum(data + begin, chunk);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// One block: thread t adds partials t, t + 512, ... in order, then the block's fixed tree.
__global__ void square_sum_total_kernel(double* total, const double* partials, int64_t count) {
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += kSquareSumThreads) sum += partials[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) *total = sum;
}

}  // namespace

void adamw_update_cuda(float* value, float* exp_avg, float* exp_avg_sq, const float* grad,
                       int64_t count, const AdamWStep& step, bool weight_decay,
                       const DeviceStepControl* control, CudaStream stream) {
  if (count <= 0) return;
  adamw_update_kernel<<<cuda_grid_stride_blocks(count), kCudaThreadsPerBlock, 0, stream>>>(
      value, exp_avg, exp_avg_sq, grad, count, step, weight_decay, control);
  FT_CUDA_CHECK_LAUNCH();
}

void sgd_update_cuda(float* value, float* momentum_buffer, const float* grad, int64_t count,
                     const SgdStep& step, bool weight_decay, const DeviceStepControl* control,
                     CudaStream stream) {
  if (count <= 0) return;
  sgd_update_kernel<<<cuda_grid_stride_blocks(count), kCudaThreadsPerBlock, 0, stream>>>(
      value, momentum_buffer, grad, count, step, weight_decay, control);
  FT_CUDA_CHECK_LAUNCH();
}

void scale_cuda(float* data, int64_t count, float scale, CudaStream stream) {
  if (count <= 0) return;
  scale_kernel<<<cuda_grid_stride_blocks(count), kCudaThreadsPerBlock, 0, stream>>>(data, count,
                                                                                    scale);
  FT_CUDA_CHECK_LAUNCH();
}

void square_sum_partials_cuda(double* partials, const float* data, int64_t count,
                              CudaStream stream) {
  if (count <= 0) return;
  const int64_t chunks = (count + kSweepChunk - 1) / kSweepChunk;
  FT_CHECK(chunks <= 0x7fffffff, "square_sum_partials_cuda: ", chunks, " chunks exceed a grid");
  square_sum_partials_kernel<<<static_cast<unsigned int>(chunks), kSquareSumThreads, 0, stream>>>(
      partials, data, count);
  FT_CUDA_CHECK_LAUNCH();
}

void square_sum_total_on_device_cuda(double* total, const double* partials, int64_t count,
                                     CudaStream stream) {
  if (count <= 0) {
    FT_CUDA_CHECK(cudaMemsetAsync(total, 0, sizeof(double), stream));
    count_launch(LaunchKind::kCopy);
    return;
  }
  square_sum_total_kernel<<<1, kSquareSumThreads, 0, stream>>>(total, partials, count);
  FT_CUDA_CHECK_LAUNCH();
}

double square_sum_total_cuda(double* total, const double* partials, int64_t count,
                             CudaStream stream) {
  if (count <= 0) return 0.0;
  square_sum_total_on_device_cuda(total, partials, count, stream);
  require_not_capturing("reading the gradient norm on the host");
  double host_total = 0.0;
  // Waits for the stream: the sweep's one synchronisation (the caller needs the norm's value).
  FT_CUDA_CHECK(
      cudaMemcpyAsync(&host_total, total, sizeof(double), cudaMemcpyDeviceToHost, stream));
  count_launch(LaunchKind::kCopy);
  FT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host_total;
}

void finish_step_control_cuda(DeviceStepControl* control, const float* loss, CudaStream stream) {
  finish_step_control_kernel<<<1, 1, 0, stream>>>(control, loss);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft

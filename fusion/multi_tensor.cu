// The multi-tensor passes on CUDA (Apex's multi_tensor_apply): each launch takes its table of
// (tensor, chunk) blocks in its kernel arguments (fusion/multi_tensor_launch.h), and block b
// updates one chunk of one tensor with the helpers of kernels/optimizer_math.h that the CPU range
// kernels also call, and (train.precision: bf16) rounds each updated value into its bf16 copy
// with core/math/bf16_math.h, as the CPU passes do. The kernels, then the launchers.
#include "core/cuda/cuda_check.h"
#include "core/math/bf16_math.h"
#include "fusion/multi_tensor.h"
#include "fusion/multi_tensor_launch.h"
#include "kernels/optimizer_math.h"
#include "kernels/step_control.h"

namespace ft {
namespace {

// One block per chunk of 65,536 floats: 128 floats per thread, coalesced (thread t touches t,
// t + 512, ...). The norm's blocks must be kSquareSumThreads wide; the others use the same.
constexpr int kMultiTensorThreads = kSquareSumThreads;

// The bf16 copy of the `count` values at `value` (updated by this thread's loop, so each thread
// reads back its own writes), at the same flat index in the copies.
__device__ inline void write_bf16_copies(const Bf16CopyTarget& copies, const float* value,
                                         int64_t count) {
  if (copies.copies == nullptr) return;
  bf16_bits* copy = copies.copies + (value - copies.values_base);
  for (int64_t i = threadIdx.x; i < count; i += kMultiTensorThreads)
    copy[i] = float_to_bf16(value[i]);
}

// __grid_constant__: the table stays in the kernel-parameter space; the block reads its entries
// from there instead of copying ~4 KB into each thread's local memory.
// With a control (a CUDA-graph step, kernels/step_control.h) the constants, the clip scale and the
// skip decision come from device memory; without one, from the arguments. The scaled gradient is
// __fmul_rn so that it is never contracted into an FMA (see kernels/optimizer.cu).
__global__ void multi_tensor_adamw_kernel(const __grid_constant__ MultiTensorLaunch<4> launch,
                                          AdamWStep step, const DeviceStepControl* control,
                                          Bf16CopyTarget copies) {
  float grad_scale = 1.0f;
  if (!apply_step_control(control, &step, &grad_scale)) return;
  const MultiTensorBlockRange range = multi_tensor_block_range(launch, blockIdx.x);
  float* value = launch.addresses[0][range.tensor] + range.begin;
  const float* grad = launch.addresses[1][range.tensor] + range.begin;
  float* exp_avg = launch.addresses[2][range.tensor] + range.begin;
  float* exp_avg_sq = launch.addresses[3][range.tensor] + range.begin;
  const float decay = launch.weight_decay[range.tensor] ? step.decay : 0.0f;
  for (int64_t i = threadIdx.x; i < range.count; i += kMultiTensorThreads)
    adamw_element(value[i], exp_avg[i], exp_avg_sq[i], __fmul_rn(grad[i], grad_scale), step, decay);
  write_bf16_copies(copies, value, range.count);
}

__global__ void multi_tensor_sgd_kernel(const __grid_constant__ MultiTensorLaunch<3> launch,
                                        SgdStep step, const DeviceStepControl* control,
                                        Bf16CopyTarget copies) {
  float grad_scale = 1.0f;
  if (!apply_step_control(control, &step, &grad_scale)) return;
  const MultiTensorBlockRange range = multi_tensor_block_range(launch, blockIdx.x);
  float* value = launch.addresses[0][range.tensor] + range.begin;
  const float* grad = launch.addresses[1][range.tensor] + range.begin;
  float* momentum_buffer = launch.addresses[2][range.tensor] + range.begin;
  const float decay = launch.weight_decay[range.tensor] ? step.weight_decay : 0.0f;
  for (int64_t i = threadIdx.x; i < range.count; i += kMultiTensorThreads)
    sgd_element(value[i], momentum_buffer[i], __fmul_rn(grad[i], grad_scale), step, decay);
  write_bf16_copies(copies, value, range.count);
}

__global__ void multi_tensor_scale_kernel(const __grid_constant__ MultiTensorLaunch<1> launch,
                                          float scale) {
  const MultiTensorBlockRange range = multi_tensor_block_range(launch, blockIdx.x);
  float* data = launch.addresses[0][range.tensor] + range.begin;
  for (int64_t i = threadIdx.x; i < range.count; i += kMultiTensorThreads) data[i] *= scale;
}

__global__ void multi_tensor_zero_kernel(const __grid_constant__ MultiTensorLaunch<1> launch) {
  const MultiTensorBlockRange range = multi_tensor_block_range(launch, blockIdx.x);
  float* data = launch.addresses[0][range.tensor] + range.begin;
  for (int64_t i = threadIdx.x; i < range.count; i += kMultiTensorThreads) data[i] = 0.0f;
}

// Block b of the pass sums its chunk as kernels/optimizer.cu's per-tensor blocks do, so both cuda
// norms give the same partials in the same order.
__global__ void multi_tensor_square_sum_kernel(
    double* partials, const __grid_constant__ MultiTensorLaunch<1> launch) {
  const MultiTensorBlockRange range = multi_tensor_block_range(launch, blockIdx.x);
  const double sum = block_square_sum(launch.addresses[0][range.tensor] + range.begin, range.count);
  if (threadIdx.x == 0) partials[launch.first_block + blockIdx.x] = sum;
}

}  // namespace

void multi_tensor_adamw_cuda(const std::vector<MultiTensorLaunch<4>>& launches,
                             const AdamWStep& step, const DeviceStepControl* control,
                             const Bf16CopyTarget& copies, CudaStream stream) {
  for (const MultiTensorLaunch<4>& launch : launches) {
    multi_tensor_adamw_kernel<<<launch.num_blocks, kMultiTensorThreads, 0, stream>>>(
        launch, step, control, copies);
    FT_CUDA_CHECK_LAUNCH();
  }
}

void multi_tensor_adamw_cuda(const std::vector<MultiTensorLaunch<4>>& launches,
                             const AdamWStep& step, const DeviceStepControl* control,
                             CudaStream stream) {
  multi_tensor_adamw_cuda(launches, step, control, Bf16CopyTarget{}, stream);
}

void multi_tensor_sgd_cuda(const std::vector<MultiTensorLaunch<3>>& launches, const SgdStep& step,
                           const DeviceStepControl* control, const Bf16CopyTarget& copies,
                           CudaStream stream) {
  for (const MultiTensorLaunch<3>& launch : launches) {
    multi_tensor_sgd_kernel<<<launch.num_blocks, kMultiTensorThreads, 0, stream>>>(launch, step,
                                                                                   control, copies);
    FT_CUDA_CHECK_LAUNCH();
  }
}

void multi_tensor_sgd_cuda(const std::vector<MultiTensorLaunch<3>>& launches, const SgdStep& step,
                           const DeviceStepControl* control, CudaStream stream) {
  multi_tensor_sgd_cuda(launches, step, control, Bf16CopyTarget{}, stream);
}

void multi_tensor_zero_cuda(const std::vector<MultiTensorLaunch<1>>& launches, CudaStream stream) {
  for (const MultiTensorLaunch<1>& launch : launches) {
    multi_tensor_zero_kernel<<<launch.num_blocks, kMultiTensorThreads, 0, stream>>>(launch);
    FT_CUDA_CHECK_LAUNCH();
  }
}

void multi_tensor_scale_cuda(const std::vector<MultiTensorLaunch<1>>& launches, float scale,
                             CudaStream stream) {
  for (const MultiTensorLaunch<1>& launch : launches) {
    multi_tensor_scale_kernel<<<launch.num_blocks, kMultiTensorThreads, 0, stream>>>(launch, scale);
    FT_CUDA_CHECK_LAUNCH();
  }
}

void multi_tensor_square_sum_partials_cuda(double* partials,
                                           const std::vector<MultiTensorLaunch<1>>& launches,
                                           CudaStream stream) {
  for (const MultiTensorLaunch<1>& launch : launches) {
    multi_tensor_square_sum_kernel<<<launch.num_blocks, kMultiTensorThreads, 0, stream>>>(partials,
                                                                                          launch);
    FT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace ft

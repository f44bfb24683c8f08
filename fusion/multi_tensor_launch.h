// The launch metadata of the CUDA multi-tensor passes (Apex's multi_tensor_apply): a list of
// tensors is cut into chunks of kSweepChunk floats, and the (tensor, chunk) pairs are packed into
// as few kernel launches as possible. Each launch carries its table in the kernel's arguments (a
// MultiTensorLaunch passed by value), so a launch needs no host-to-device copy: CUDA passes kernel
// parameters in constant memory, classically limited to 4,096 bytes (CUDA 12.1 allows 32 KB on
// Volta and later; staying under 4 KB, as Apex does, works with any toolkit).
// Block b of a launch runs the chunk multi_tensor_block_range(launch, b) of one tensor, with that
// tensor's Depth addresses (e.g. value, grad, exp_avg, exp_avg_sq for AdamW), so the kernel
// needs no search. Host-only code and the kernels (fusion/multi_tensor.cu) share the header, which
// needs no CUDA header, so tests/multi_tensor_launch_test.cpp checks the packing on the CPU.
// Thread safety: pure functions and plain data.
#pragma once
#include <cstdint>
#include <vector>

#include "core/hd.h"
#include "model/optimizer.h"

namespace ft {

// How a MultiTensorLaunch is sized. Of the 4,096 bytes of kernel parameters, kMultiTensorReserve
// are left for the kernel's other arguments (AdamWStep is 24 bytes, SgdStep 16, a partials
// pointer 8), the rest holds the table. The block table is fixed at kMultiTensorMaxBlocks (as in
// Apex: 320 blocks = 20.9M floats per launch, 2.4 blocks per SM of an H200); the tensor table
// takes what remains: per tensor Depth addresses, a numel and a flag, 8 * Depth + 9 bytes.
constexpr int kCudaKernelParamBytes = 4096;
constexpr int kMultiTensorReserve = 256;
constexpr int kMultiTensorMaxBlocks = 320;
constexpr int kMultiTensorHeaderBytes = 24;  // num_tensors, num_blocks, chunk_size, first_block
constexpr int multi_tensor_max_tensors(int depth) {
  return (kCudaKernelParamBytes - kMultiTensorReserve - kMultiTensorHeaderBytes -
          kMultiTensorMaxBlocks * (4 + 1)) /
         (8 * depth + 8 + 1);
}

// One launch's table. Depth is how many arrays each tensor has. Fields are ordered by alignment
// so there is no padding inside; the size is static_asserted below.
template <int Depth>
struct MultiTensorLaunch {
  static constexpr int kDepth = Depth;
  static constexpr int kMaxTensors = multi_tensor_max_tensors(Depth);  // 130, 88, 67, 54
  static constexpr int kMaxBlocks = kMultiTensorMaxBlocks;
  static_assert(kMaxTensors <= 256, "block_tensor is a uint8_t");

  float* addresses[Depth][kMaxTensors];  // addresses[d][t]: array d of tensor t
  int64_t numel[kMaxTensors];
  // Blocks of earlier launches of the same pass: this launch's block b is the pass's block
  // first_block + b (the gradient norm writes its partial there).
  int64_t first_block;
  int32_t block_chunk[kMaxBlocks];   // block b covers chunk block_chunk[b] of its tensor
  int32_t num_tensors, num_blocks;   // used entries of the tables
  int32_t chunk_size;                // floats per chunk (kSweepChunk outside tests)
  uint8_t block_tensor[kMaxBlocks];  // block b's tensor slot in this launch
  uint8_t weight_decay[kMaxTensors];
};

static_assert(sizeof(MultiTensorLaunch<1>) + kMultiTensorReserve <= kCudaKernelParamBytes);
static_assert(sizeof(MultiTensorLaunch<2>) + kMultiTensorReserve <= kCudaKernelParamBytes);
static_assert(sizeof(MultiTensorLaunch<3>) + kMultiTensorReserve <= kCudaKernelParamBytes);
static_assert(sizeof(MultiTensorLaunch<4>) + kMultiTensorReserve <= kCudaKernelParamBytes);

// One tensor of the list to pack: its Depth arrays of `numel` floats each.
template <int Depth>
struct MultiTensorInput {
  float* addresses[Depth] = {};
  int64_t numel = 0;
  bool weight_decay = false;
};

// Cuts every tensor into chunks of `chunk_size` floats (the last one shorter) and packs the
// (tensor, chunk) blocks in list order into launches: a launch is closed when its block table or
// its tensor table is full, and a tensor whose chunks do not all fit continues in the next launch
// (entered there again). Empty tensors are skipped; an empty list gives no launches.
// REQUIRES: chunk_size > 0; numel >= 0.
template <int Depth>
std::vector<MultiTensorLaunch<Depth>> pack_multi_tensor_launches(
    const std::vector<MultiTensorInput<Depth>>& tensors, int32_t chunk_size = kSweepChunk);

// Blocks of all launches together (the gradient norm's partial count).
template <int Depth>
int64_t multi_tensor_block_count(const std::vector<MultiTensorLaunch<Depth>>& launches) {
  return launches.empty() ? 0 : launches.back().first_block + launches.back().num_blocks;
}

// What block `block` of `launch` covers: floats [begin, begin + count) of tensor slot `tensor`.
struct MultiTensorBlockRange {
  int tensor = 0;
  int64_t begin = 0, count = 0;
};

template <int Depth>
FT_HD MultiTensorBlockRange multi_tensor_block_range(const MultiTensorLaunch<Depth>& launch,
                                                     int block) {
  MultiTensorBlockRange range;
  range.tensor = launch.block_tensor[block];
  range.begin = static_cast<int64_t>(launch.block_chunk[block]) * launch.chunk_size;
  const int64_t left = launch.numel[range.tensor] - range.begin;
  range.count = left < launch.chunk_size ? left : launch.chunk_size;
  return range;
}

}  // namespace ft

namespace ft {

// The multi-tensor kernels (multi_tensor.cu; CUDA builds only), one launch per table, enqueued
// on `stream`. Array order in the tables: AdamW {value, grad, exp_avg, exp_avg_sq}; SGD {value,
// grad, momentum_buffer}; zero, scale and the norm {grad}. A non-null `control` (device memory,
// kernels/step_control.h) overrides `step` and supplies the clip scale and the skip decision.
struct DeviceStepControl;
void multi_tensor_adamw_cuda(const std::vector<MultiTensorLaunch<4>>& launches,
                             const AdamWStep& step, const DeviceStepControl* control,
                             CudaStream stream);
void multi_tensor_sgd_cuda(const std::vector<MultiTensorLaunch<3>>& launches, const SgdStep& step,
                           const DeviceStepControl* control, CudaStream stream);
void multi_tensor_zero_cuda(const std::vector<MultiTensorLaunch<1>>& launches, CudaStream stream);
void multi_tensor_scale_cuda(const std::vector<MultiTensorLaunch<1>>& launches, float scale,
                             CudaStream stream);
// Writes the pass's block b's sum of squares (in double) to partials[b]; square_sum_total_cuda
// (model/optimizer.h) then adds them. REQUIRES: partials holds multi_tensor_block_count doubles.
void multi_tensor_square_sum_partials_cuda(double* partials,
                                           const std::vector<MultiTensorLaunch<1>>& launches,
                                           CudaStream stream);

}  // namespace ft

// Conv2dOp's oneDNN state: built by conv2d_primitives.cpp, run by conv2d.cpp. Internal to
// model/ops (only the two files include it); the op's API is model/ops/conv2d.h.
// Precision: fp32 primitives, or (train.precision: bf16 on a CPU with bf16 instructions) direct
// primitives whose src, weights and diff_dst are bf16 while dst, diff_src and diff_weights stay
// fp32, so every product accumulates in fp32 and gradients leave the op in fp32.
// Thread safety: as Conv2dOp (one training thread per op); the scratch buffers are per thread.
#pragma once
#include <cstdint>
#include <dnnl.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/ops/conv2d.h"

namespace ft {
namespace conv2d_detail {

// Plain oihw weights as one primitive wants them. When the layouts agree, `prim` is `user`.
struct StagedWeights {
  dnnl::memory user;  // oihw; its handle is set at every call
  dnnl::memory prim;
  dnnl::reorder reorder;  // user -> prim
  bool reordered = false;

  void to_prim(const void* user_data);
};

StagedWeights stage_weights(const dnnl::memory::desc& user_md, const dnnl::memory::desc& prim_md);

// The per-thread scratch buffers every convolution on this thread reuses (so they stay in cache),
// aligned to a cache line like our tensors (oneDNN's 32-byte stores then never split a line).
enum class Scratch {
  kInputGradient,  // backward data writes dx here when it must be added into ours
  kWideInput,      // the widening path: x widened to fp32
  kWideGradient,   // the widening path: dy rounded to bf16 and widened back
};
// REQUIRES: the previous pointer of the same slot is no longer used.
float* thread_scratch(Scratch slot, int64_t count);

}  // namespace conv2d_detail

struct Conv2dOp::Primitives {
  ConvAlgorithm algorithm = ConvAlgorithm::kDirect;  // resolved; kDirect for bf16 operands
  DType input = DType::kF32;                         // the input's dtype they were built for
  // What src, weights and diff_dst hold: bf16 only on the native path. A bf16 input with fp32
  // operands is widened first (the CPU has no bf16 instructions, or oneDNN had no fast kernel).
  DType operands = DType::kF32;
  std::vector<float> widened_weights;                  // widening path: the bf16 copy, widened
  std::vector<float> winograd_weights;                 // when kWinograd: transformed per pass
  dnnl::convolution_forward forward;                   // when kDirect
  dnnl::convolution_backward_data forward_transposed;  // when kTransposed
  std::vector<float> flipped_weights;                  // when kTransposed: flip_kernel's output
  conv2d_detail::StagedWeights forward_weights;        // ours, or flipped_weights
  dnnl::convolution_backward_data backward_data;
  dnnl::convolution_backward_weights backward_weights;
  conv2d_detail::StagedWeights data_weights;  // ours, for backward data
  dnnl::memory src, dst, diff_dst;    // over our activation buffers; handles set at every call
  dnnl::memory diff_src_written;      // over thread_scratch: backward data writes dx here
  dnnl::memory diff_weights_written;  // op-owned, in the primitive's layout
  dnnl::memory diff_weights_user;     // oihw over the parameter's gradient
  dnnl::reorder add_diff_weights;     // diff_weights_written -> diff_weights_user, with sum
  std::string forward_impl;
  // What the forward weights above were derived from; backward invalidates them (Winograd's
  // backward data reuses winograd_weights).
  bool forward_weights_valid = false;
  uint64_t forward_weights_version = 0;
  const void* forward_weights_source = nullptr;

  bool widens() const { return input == DType::kBF16 && operands == DType::kF32; }
};

}  // namespace ft

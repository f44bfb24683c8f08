// Entry checks shared by the op files: every forward/backward confirms the tensors it was handed
// hold the element counts its constructor was built for, so a mis-wired graph fails with the op's
// name instead of reading out of bounds.
// Thread safety: stateless.
#pragma once
#include <cstdint>

#include "core/check.h"
#include "core/tensor.h"
#include "model/graph.h"

namespace ft {

// Saved state (statistics, masks, scratch) lives on the workspace's device: made at first use,
// remade only when its size or device changes.
inline void reuse_or_allocate(Tensor& buffer, int64_t numel, Device device) {
  if (buffer.numel() != numel || buffer.device() != device) buffer = Tensor::empty({numel}, device);
}

inline void expect_numel(const Tensor& tensor, int64_t numel, const Op& op, const char* role) {
  FT_CHECK(tensor.numel() == numel, op.kind(), " '", op.name, "': ", role, " has shape ",
           shape_str(tensor.shape()), " (", tensor.numel(), " elements), expected ", numel,
           " elements");
}

inline void expect_arity(const Op& op, size_t inputs, size_t outputs, size_t params) {
  FT_CHECK(op.inputs.size() == inputs && op.outputs.size() == outputs && op.params.size() == params,
           op.kind(), " '", op.name, "': wired with ", op.inputs.size(), " inputs, ",
           op.outputs.size(), " outputs, ", op.params.size(), " params; expected ", inputs, ", ",
           outputs, ", ", params);
}

// The two operands of one of the op's GEMMs: both fp32 or both bf16 (core/gemm.h).
inline void expect_gemm_operands(const Op& op, const Tensor& a, const Tensor& b) {
  FT_CHECK(a.dtype() == b.dtype(), op.kind(), " '", op.name,
           "': GEMM operands of different dtypes (", dtype_name(a.dtype()), ", ",
           dtype_name(b.dtype()), ")");
}

}  // namespace ft

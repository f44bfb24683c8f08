// CommDtype: the element type gradients travel in between ranks (comm.grad_dtype). Gradients stay
// fp32 in ParamStore; with kBf16 each bucket is rounded to bf16 for the allreduce (half the bytes
// on the wire) and widened back to fp32 afterwards.
// Thread safety: values and pure functions.
#pragma once
#include <cstdint>
#include <string>

#include "core/check.h"

namespace ft {

enum class CommDtype { kFloat32, kBf16 };

inline int64_t comm_dtype_bytes(CommDtype dtype) {
  return dtype == CommDtype::kBf16 ? 2 : 4;
}

// The comm.grad_dtype spelling: "fp32" or "bf16".
inline const char* comm_dtype_name(CommDtype dtype) {
  return dtype == CommDtype::kBf16 ? "bf16" : "fp32";
}

// REQUIRES: `name` is a value the config already validated; anything else is a programming error.
inline CommDtype comm_dtype_from_name(const std::string& name) {
  if (name == "fp32") return CommDtype::kFloat32;
  if (name == "bf16") return CommDtype::kBf16;
  FT_FAIL("comm.grad_dtype '", name, "' is not one of: fp32, bf16");
}

}  // namespace ft

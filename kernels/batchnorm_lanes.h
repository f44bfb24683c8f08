// The 8-float vectors the BatchNorm family's CPU loops work in (kernels/batchnorm_loops.h,
// fusion/ops/batchnorm_add_relu.cpp): a channel is every C-th float of NHWC activations, so a
// row's channels are a few vectors and per-channel sums are vectors of partial sums. GCC/Clang
// vector extensions, compiled for whatever the build targets (AVX2 at least).
// Thread safety: pure functions.
#pragma once
#include <cstdint>
#include <cstring>

namespace ft {
namespace batchnorm_lanes {

constexpr int kLanes = 8;
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

// Float partial sums run over at most this many rows (relative error ~1e-5 at worst); the chunks
// are then summed in double, in chunk order.
constexpr int64_t kRowsPerChunk = 128;

inline Lanes load(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, Lanes v) {
  std::memcpy(p, &v, sizeof v);
}

}  // namespace batchnorm_lanes
}  // namespace ft

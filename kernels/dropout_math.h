// Inverted dropout's keep decision and scale, shared by DropoutOp, ResidualLayerNormOp and their
// CUDA kernels, so a mask drawn on the GPU equals the CPU's bit for bit:
//   keep_i = hash_uniform(seed, i) >= p,   y_i = keep_i ? x_i / (1 - p) : 0
// The counter-based hash (core/rng.h) makes keep_i a pure function of (seed, element index), with
// seed = the step's dropout_seed ^ the op's salt.
// Thread safety: pure functions.
#pragma once
#include <cstdint>

#include "core/hd.h"
#include "core/rng.h"

namespace ft {

FT_HD bool dropout_keep(uint64_t seed, uint64_t index, float p) {
  return hash_uniform(seed, index) >= p;
}

// Kept elements scale by 1 / (1 - p), so the expectation of y is x. REQUIRES: p < 1.
FT_HD float dropout_scale(float p) {
  return 1.0f / (1.0f - p);
}

}  // namespace ft

// bfloat16: the top 16 bits of an IEEE float32 (8 exponent bits, 7 mantissa bits), so it holds
// fp32's range at ~3 significant digits. Stored as its bit pattern (uint16_t) on both devices, so
// CPU and CUDA code share these helpers and CPU tests cover the GPU's rounding.
// Rounding is to nearest, ties to even, as oneDNN, cuBLASLt and PyTorch round; NaN stays NaN
// (quiet), and overflow rounds to infinity as the IEEE rules say.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/hd.h"

namespace ft {

using bf16_bits = uint16_t;

FT_HD uint32_t float_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof(bits));
  return bits;
}

FT_HD float float_from_bits(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof(value));
  return value;
}

// Adding 0x7FFF plus the lowest kept bit, then truncating, rounds to nearest with ties to even:
// a tie (low half exactly 0x8000) carries only when the kept part is odd.
FT_HD bf16_bits float_to_bf16(float value) {
  const uint32_t bits = float_bits(value);
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) != 0)
    return static_cast<bf16_bits>((bits >> 16) | 0x0040u);  // NaN: keep it quiet and a NaN
  const uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<bf16_bits>((bits + rounding) >> 16);
}

FT_HD float bf16_to_float(bf16_bits value) {
  return float_from_bits(static_cast<uint32_t>(value) << 16);
}

// An fp32 result stored as its destination's element type: a float as is, a bf16 rounded once.
// For kernels that write either (a fused op writing a convolution's bf16 operand).
FT_HD void store_value(float* out, float value) {
  *out = value;
}
FT_HD void store_value(bf16_bits* out, float value) {
  *out = float_to_bf16(value);
}

// The float a value becomes after a trip through bf16: what a bf16 GEMM sees of an fp32 operand.
FT_HD float round_to_bf16(float value) {
  return bf16_to_float(float_to_bf16(value));
}

}  // namespace ft

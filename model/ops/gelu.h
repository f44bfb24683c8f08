// GELU activation, tanh approximation (GPT-2), elementwise over `numel` floats:
//   y = 0.5 x (1 + tanh(s (x + 0.044715 x^3))),  s = sqrt(2/pi)    (core/math/gelu.h)
// Inputs {x}, outputs {y}. Backward reads x again, so nothing is saved.
// The loops use a branch-free rational tanh so the compiler vectorises them; libm's scalar tanhf
// costs 4-30 ns per call, which made GELU the most expensive op of a small GPT step. They agree
// with ft::gelu_tanh / ft::gelu_tanh_grad to within 1e-6 (tested).
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <cstdint>
#include <cstring>

#include "model/graph.h"

namespace ft {

// tanh(x) with at most 3e-7 absolute/relative error: an odd degree-13 / even degree-6 rational
// minimax fit on |x| <= 7.99881 (beyond which tanh rounds to +-1 in float), evaluated on |x| with
// the sign put back. |x| is clamped with an integer min on its bit pattern (non-negative floats
// order like their bits): a float ternary lets the compiler constant-fold the clamped branch and
// split the loop, which stops vectorisation. NaN clamps to +-1; GELU still returns NaN through
// its factor x.
inline float tanh_rational(float x) {
  constexpr uint32_t kClampBits = 0x40fff644u;  // 7.99881172180175781f
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t sign = bits & 0x80000000u;
  uint32_t abs_bits = bits & 0x7fffffffu;
  abs_bits = abs_bits < kClampBits ? abs_bits : kClampBits;
  float a;
  std::memcpy(&a, &abs_bits, sizeof a);
  const float a2 = a * a;
  float p = a2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
  p = a2 * p - 8.60467152213735e-11f;
  p = a2 * p + 5.12229709037114e-08f;
  p = a2 * p + 1.48572235717979e-05f;
  p = a2 * p + 6.37261928875436e-04f;
  p = a2 * p + 4.89352455891786e-03f;
  float q = a2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
  q = a2 * q + 2.26843463243900e-03f;
  q = a2 * q + 4.89352518554385e-03f;
  float result = a * p / q;
  uint32_t result_bits;
  std::memcpy(&result_bits, &result, sizeof result_bits);
  result_bits |= sign;
  std::memcpy(&result, &result_bits, sizeof result);
  return result;
}

void gelu_forward(float* y, const float* x, int64_t numel);
// dx += dy * gelu'(x).
void gelu_backward(float* dx, const float* dy, const float* x, int64_t numel);

class GeluOp : public Op {
 public:
  explicit GeluOp(int64_t numel);
  const char* kind() const override { return "gelu"; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;

 private:
  void check_wiring(const Workspace& ws) const;
  int64_t numel_;
};

}  // namespace ft

// Comparisons shared by the fusion twin tests (tests/fusion_*_test.cpp): how far a fused op's
// tensor is from its unfused twin's, relative to the twin's largest magnitude.
// Thread safety: stateless.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/tensor.h"

namespace ft {
namespace fusion_test {

// max |a - b| over max |b|: "within relative 1e-5 of the largest". NaN anywhere in a makes it
// NaN, which fails every bound.
inline float rel_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  float diff = 0.0f, scale = 0.0f;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) {
    const float error = std::fabs(a.data()[i] - b.data()[i]);
    diff = std::isnan(error) || error > diff ? error : diff;
    scale = std::max(scale, std::fabs(b.data()[i]));
  }
  return scale > 0.0f ? diff / scale : diff;
}

inline float max_abs(const Tensor& t) {
  float m = 0.0f;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.data()[i]));
  return m;
}

}  // namespace fusion_test
}  // namespace ft

// Comparison helpers shared by the horizontal-fusion tests (tests/fusion_qkv_test.cpp and
// tests/fusion_qkv_pass_test.cpp): distances relative to the largest entry, one training step's
// loss and parameter gradients, and op counts by kind.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/graph.h"
#include "model/params.h"

namespace ft {
namespace fusion_test {

// max |a - b| over max |b|: the distance relative to the largest entry.
inline float rel_diff(const float* a, const float* b, int64_t n) {
  float diff = 0.0f, scale = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return scale > 0.0f ? diff / scale : diff;
}

inline float rel_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  return rel_diff(a.data(), b.data(), std::min(a.numel(), b.numel()));
}

inline float max_abs(const Tensor& t) {
  float m = 0.0f;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.data()[i]));
  return m;
}

struct StepResult {
  float loss = 0.0f;
  std::vector<std::vector<float>> grads;  // per parameter
};

// The loss, and every parameter gradient within 1e-5 of its largest entry. k_norm.bias is the
// exception that proves the gradient real: adding b to every key adds q·b to all of a query's
// scores, which the softmax cancels, so its gradient is rounding noise (~1e-9) in both graphs;
// its error is measured against the largest gradient of all instead.
inline void expect_same_step(const StepResult& fused, const StepResult& unfused,
                             const ParamStore& params) {
  EXPECT_NEAR(fused.loss, unfused.loss, 1e-5f * std::fabs(unfused.loss));
  ASSERT_EQ(fused.grads.size(), unfused.grads.size());
  float largest_of_all = 0.0f;
  for (const std::vector<float>& grad : unfused.grads)
    for (float g : grad) largest_of_all = std::max(largest_of_all, std::fabs(g));
  for (size_t p = 0; p < unfused.grads.size(); ++p) {
    const std::string& name = params[static_cast<ParamId>(p)].name;
    const std::vector<float>& expected = unfused.grads[p];
    float largest = 0.0f, diff = 0.0f;
    for (size_t i = 0; i < expected.size(); ++i) {
      largest = std::max(largest, std::fabs(expected[i]));
      diff = std::max(diff, std::fabs(fused.grads[p][i] - expected[i]));
    }
    const bool cancelled = name.size() > 11 && name.substr(name.size() - 11) == "k_norm.bias";
    EXPECT_LT(diff / std::max(largest, cancelled ? largest_of_all : 0.0f), 1e-5f) << name;
    if (!cancelled) {
      EXPECT_GT(largest, 1e-6f) << name << " has no gradient";
    }
  }
}

inline int count_kind(const Graph& graph, OpKind kind) {
  return static_cast<int>(std::count_if(graph.ops.begin(), graph.ops.end(),
                                        [&](const auto& op) { return op->op_kind() == kind; }));
}

}  // namespace fusion_test
}  // namespace ft

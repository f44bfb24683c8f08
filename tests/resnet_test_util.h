// Shared scaffolding for the ResNet op tests: random fills, a one-op graph closed by a
// weighted-sum loss, and PyTorch-index to NCHW/NHWC storage mappings.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "model/executor.h"
#include "model/gradcheck.h"
#include "model/ops/batchnorm.h"
#include "model/ops/conv2d.h"
#include "model/ops/global_avg_pool.h"
#include "model/ops/relu.h"

namespace ft {
namespace resnet_test {

void fill_normal(Tensor& tensor, Rng& rng, float mean = 0.0f, float std = 1.0f) {
  for (int64_t i = 0; i < tensor.numel(); ++i) tensor.data()[i] = mean + std * rng.normal();
}

// One op from value x to value y, closed by a weighted-sum loss so every output element carries a
// distinct gradient.
struct SingleOpGraph {
  ParamStore params;
  Graph graph;
  ValueId x = -1, y = -1;
  Op* op = nullptr;
  std::unique_ptr<Executor> executor;
  Workspace ws;

  SingleOpGraph(const Shape& x_shape, const Shape& y_shape) {
    x = graph.add_value("x", x_shape);
    y = graph.add_value("y", y_shape);
  }
  template <typename OpType, typename... Args>
  OpType& add(std::vector<ParamId> param_ids, Args&&... args) {
    OpType& added =
        graph.add_op<OpType>("op", {x}, {y}, std::move(param_ids), std::forward<Args>(args)...);
    op = &added;
    add_weighted_sum_loss(graph, y, /*seed=*/7);
    return added;
  }
  // Allocates and initialises params, makes the workspace, fills x ~ N(0, 1).
  void finish(uint64_t seed) {
    params.allocate();
    params.initialize(seed);
    executor = std::make_unique<Executor>(graph, params);
    executor->set_poison_fresh_gradients(true);  // an incomplete overwrite shows as NaN
    ws = executor->make_workspace();
    Rng rng(seed + 1);
    fill_normal(ws.values[x], rng);
  }
  void forward_backward() {
    params.zero_grads();
    executor->forward(ws);
    executor->backward(ws);
  }
};

// Index helpers: PyTorch indices (sample, channel, row, column) to storage offsets.
int64_t nchw_index(int64_t b, int64_t c, int64_t h, int64_t w, int64_t channels, int64_t height,
                   int64_t width) {
  return ((b * channels + c) * height + h) * width + w;
}
int64_t nhwc_index(int64_t b, int64_t c, int64_t h, int64_t w, int64_t channels, int64_t height,
                   int64_t width) {
  return ((b * height + h) * width + w) * channels + c;
}
int64_t activation_index(ActivationLayout layout, int64_t b, int64_t c, int64_t h, int64_t w,
                         int64_t channels, int64_t height, int64_t width) {
  return layout == ActivationLayout::kNchw ? nchw_index(b, c, h, w, channels, height, width)
                                           : nhwc_index(b, c, h, w, channels, height, width);
}

}  // namespace resnet_test
}  // namespace ft

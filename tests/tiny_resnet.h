// A ready-to-run tiny ResNet (blocks 1, width 4) with random images and labels, shared by the
// ResNet model tests.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "model/executor.h"
#include "model/gradcheck.h"
#include "model/resnet.h"

namespace ft {
namespace resnet_test {

// A ready-to-run tiny ResNet with random images and labels.
struct TinyResnet {
  ResnetShape shape{1, 4};
  int batch;
  ParamStore params;
  ResnetParamIds ids;
  Graph graph;
  std::unique_ptr<Executor> executor;
  Workspace ws;

  explicit TinyResnet(int batch_size, uint64_t seed = 5) : batch(batch_size) {
    ids = register_resnet_params(shape, params);
    graph = build_resnet_graph(shape, batch, ids);
    params.allocate();
    params.initialize(seed);
    executor = std::make_unique<Executor>(graph, params);
    executor->set_poison_fresh_gradients(true);  // an incomplete overwrite shows as NaN
    ws = executor->make_workspace();
    Rng rng(seed + 1);
    Tensor& images = ws.values[graph.input];
    for (int64_t i = 0; i < images.numel(); ++i) images.data()[i] = rng.normal();
    for (int b = 0; b < batch; ++b) ws.targets.push_back(static_cast<int32_t>(rng.below(10)));
  }
};

}  // namespace resnet_test
}  // namespace ft

// Runs one graph on two devices from the same parameters and inputs and compares everything it
// produces: every root value, every activation gradient, every parameter gradient and the loss.
// The CUDA kernel tests (tests/cuda_*_test.cpp) build a graph around the op under test and
// compare cpu against cuda with it; tests/device_compare_test.cpp checks the harness itself on
// cpu against cpu, where a deliberately wrong op must be caught.
// Thread safety: the calling thread only.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/executor.h"
#include "model/gradcheck.h"

namespace ft {
namespace device_compare {

// Adds the graph's values, ops and parameters (unallocated). The graph must set graph.loss
// (add_weighted_sum_loss is the usual choice) and may set graph.input.
using GraphBuilder = std::function<void(Graph& graph, ParamStore& params)>;

struct BatchIds {
  std::vector<int32_t> tokens, targets;
};

struct DeviceRun {
  std::vector<std::string> names;  // per root value
  std::vector<std::vector<float>> values, grads;
  std::vector<float> param_grads;   // flat, registration order
  std::vector<float> param_values;  // after forward (BatchNorm running statistics move)
  std::vector<float> buffers;
  float loss = 0.0f;
};

// Builds the graph, initialises parameters from `seed` (normal, std 0.5 for every parameter, so
// a zero-initialised bias still exercises its kernel), fills graph.input and every other value
// no op writes with normal noise, runs forward and (train graphs) backward on `device`, with
// parameter gradients starting as noise and fresh activation gradients as NaN (see below).
inline DeviceRun run_on(Device device, const GraphBuilder& build, const BatchIds& ids,
                        uint64_t seed = 7) {
  Graph graph;
  ParamStore params;
  build(graph, params);
  params.allocate(device);
  Rng rng(seed);
  for (ParamId id = 0; id < params.size(); ++id) {
    std::vector<float> host(static_cast<size_t>(params[id].value.numel()));
    const bool scale_like = params[id].init == ParamInit::kOnes;
    for (float& entry : host) entry = (scale_like ? 1.0f : 0.0f) + 0.5f * rng.normal();
    if (!params[id].trainable && params[id].name.find("var") != std::string::npos)
      for (float& entry : host) entry = std::fabs(entry) + 0.1f;  // a variance stays positive
    params[id].value.copy_from(Tensor::wrap(host.data(), params[id].shape));
  }
  params.mark_changed();
  Executor executor(graph, params);
  Workspace ws = executor.make_workspace();
  ws.tokens = ids.tokens;
  ws.targets = ids.targets;
  ws.dropout_seed = seed * 31 + 1;
  std::vector<uint8_t> written(graph.values.size(), 0);
  for (const auto& op : graph.ops)
    for (ValueId id : op->outputs)
      written[graph.values[id].is_view() ? graph.values[id].view_of : id] = 1;
  for (ValueId id = 0; id < static_cast<ValueId>(graph.values.size()); ++id) {
    if (graph.values[id].is_view() || written[id]) continue;
    std::vector<float> host(static_cast<size_t>(ws.values[id].numel()));
    for (float& entry : host) entry = rng.normal();
    ws.values[id].copy_from(Tensor::wrap(host.data(), ws.values[id].shape()));
  }
  // Parameter gradients start as noise (the same on both devices), so a kernel that overwrites
  // (=) where it must accumulate (+=) disagrees; activation gradients handed out fresh start as
  // NaN, so one that accumulates into a fresh buffer, or leaves part of it unwritten, poisons it.
  std::vector<float> grad_noise(static_cast<size_t>(params.flat_grads().numel()));
  for (float& entry : grad_noise) entry = 0.25f * rng.normal();
  if (!grad_noise.empty())
    params.flat_grads().copy_from(Tensor::wrap(grad_noise.data(), params.flat_grads().shape()));
  executor.set_poison_fresh_gradients(true);
  executor.forward(ws);
  if (graph.mode == GraphMode::kTrain) executor.backward(ws);
  DeviceRun run;
  for (ValueId id = 0; id < static_cast<ValueId>(graph.values.size()); ++id) {
    if (graph.values[id].is_view()) continue;
    run.names.push_back(graph.values[id].name);
    run.values.push_back(ws.values[id].to_host_vector());
    run.grads.push_back(ws.grads[id].defined() && ws.grads[id].numel() > 0
                            ? ws.grads[id].to_host_vector()
                            : std::vector<float>{});
  }
  run.param_grads = params.flat_grads().to_host_vector();
  run.param_values = params.flat_values().to_host_vector();
  run.buffers = params.flat_buffers().to_host_vector();
  run.loss = executor.loss(ws);
  return run;
}

// Largest |a - b| / (atol + rtol |b|) over two arrays; <= 1 means close. Reports where.
inline double worst_ratio(const std::vector<float>& a, const std::vector<float>& b, double rtol,
                          double atol, size_t* where) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double bound = atol + rtol * std::fabs(static_cast<double>(b[i]));
    const double ratio = std::isfinite(a[i]) && std::isfinite(b[i])
                             ? std::fabs(static_cast<double>(a[i]) - b[i]) / bound
                             : (std::isnan(a[i]) == std::isnan(b[i]) && a[i] == b[i] ? 0.0 : 1e30);
    if (ratio > worst) {
      worst = ratio;
      *where = i;
    }
  }
  return worst;
}

// "<what>[i]: a vs b" for the worst entry of `actual` outside atol + rtol |expected|; empty when
// every entry is within.
inline std::string difference(const std::string& what, const std::vector<float>& actual,
                              const std::vector<float>& expected, double rtol, double atol) {
  if (actual.size() != expected.size())
    return what + ": " + std::to_string(actual.size()) + " entries vs " +
           std::to_string(expected.size());
  size_t where = 0;
  if (worst_ratio(actual, expected, rtol, atol, &where) <= 1.0) return "";
  return what + "[" + std::to_string(where) + "]: " + std::to_string(actual[where]) + " vs " +
         std::to_string(expected[where]);
}

// Every difference between two runs: outputs, gradients, parameter gradients, parameters and
// buffers after the step, and the loss.
inline std::vector<std::string> run_differences(const DeviceRun& actual, const DeviceRun& expected,
                                                double rtol, double atol) {
  std::vector<std::string> found;
  auto note = [&](std::string text) {
    if (!text.empty()) found.push_back(std::move(text));
  };
  if (actual.names != expected.names) return {"the two graphs have different values"};
  for (size_t v = 0; v < actual.names.size(); ++v) {
    note(difference("value " + actual.names[v], actual.values[v], expected.values[v], rtol, atol));
    note(difference("grad of " + actual.names[v], actual.grads[v], expected.grads[v], rtol, atol));
  }
  note(difference("parameter gradients", actual.param_grads, expected.param_grads, rtol, atol));
  note(difference("parameters", actual.param_values, expected.param_values, rtol, atol));
  note(difference("buffers", actual.buffers, expected.buffers, rtol, atol));
  note(difference("loss", {actual.loss}, {expected.loss}, rtol, atol));
  return found;
}

inline void expect_runs_close(const DeviceRun& actual, const DeviceRun& expected, double rtol,
                              double atol) {
  for (const std::string& text : run_differences(actual, expected, rtol, atol))
    ADD_FAILURE() << text << " (rtol " << rtol << ", atol " << atol << ")";
}

// Fused against unfused on one device (tests/cuda_*_test.cpp, the BatchNormAddReluOp tests): the
// values both graphs name alike (inputs and results), their gradients, parameter gradients, buffers
// and the loss.
inline void expect_twins_close(const DeviceRun& fused, const DeviceRun& unfused, double rtol,
                               double atol) {
  int shared = 0;
  for (size_t f = 0; f < fused.names.size(); ++f)
    for (size_t u = 0; u < unfused.names.size(); ++u) {
      if (fused.names[f] != unfused.names[u]) continue;
      ++shared;
      const std::string name = fused.names[f];
      for (const std::string& text :
           {difference("value " + name, fused.values[f], unfused.values[u], rtol, atol),
            difference("grad of " + name, fused.grads[f], unfused.grads[u], rtol, atol)})
        if (!text.empty()) ADD_FAILURE() << text;
    }
  EXPECT_GE(shared, 2) << "the twins share no input and result names";
  for (const std::string& text :
       {difference("parameter gradients", fused.param_grads, unfused.param_grads, rtol, atol),
        difference("buffers", fused.buffers, unfused.buffers, rtol, atol),
        difference("loss", {fused.loss}, {unfused.loss}, rtol, atol)})
    if (!text.empty()) ADD_FAILURE() << text;
}

}  // namespace device_compare
}  // namespace ft

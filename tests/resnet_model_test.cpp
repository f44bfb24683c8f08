// Tests of the ResNet builder: torchvision parameter names, shapes, order and flags for resnet8
// and resnet20; graph shapes; a finite-difference check of a whole tiny ResNet; train and eval
// graphs (batch against running statistics); and that a few SGD steps fit a fixed batch.
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
#include "tests/tiny_resnet.h"

namespace ft {
namespace {

using resnet_test::TinyResnet;

struct Entry {
  std::string name;
  Shape shape;
};

// Expected registrations, written out from the torchvision naming scheme independently of
// resnet.cpp: BN entries expand to weight, bias, running_mean, running_var.
std::vector<Entry> expected_params(int blocks, int width) {
  std::vector<Entry> entries;
  auto bn = [&](const std::string& prefix, int64_t c) {
    for (const char* field : {"weight", "bias", "running_mean", "running_var"})
      entries.push_back({prefix + "." + field, {c}});
  };
  entries.push_back({"conv1.weight", {width, 1, 3, 3}});
  bn("bn1", width);
  int64_t in = width;
  for (int stage = 1; stage <= 3; ++stage) {
    const int64_t out = int64_t{width} << (stage - 1);
    for (int b = 0; b < blocks; ++b) {
      const std::string p = "layer" + std::to_string(stage) + "." + std::to_string(b);
      entries.push_back({p + ".conv1.weight", {out, in, 3, 3}});
      bn(p + ".bn1", out);
      entries.push_back({p + ".conv2.weight", {out, out, 3, 3}});
      bn(p + ".bn2", out);
      if (b == 0 && stage > 1) {
        entries.push_back({p + ".downsample.0.weight", {out, in, 1, 1}});
        bn(p + ".downsample.1", out);
      }
      in = out;
    }
  }
  entries.push_back({"fc.weight", {10, 4 * width}});
  entries.push_back({"fc.bias", {10}});
  return entries;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void expect_params_match(const ParamStore& params, const std::vector<Entry>& expected) {
  ASSERT_EQ(params.size(), static_cast<int>(expected.size()));
  for (int id = 0; id < params.size(); ++id) {
    const Param& p = params[id];
    EXPECT_EQ(p.name, expected[id].name) << "registration " << id;
    EXPECT_EQ(p.shape, expected[id].shape) << p.name;
    const bool buffer = ends_with(p.name, "running_mean") || ends_with(p.name, "running_var");
    EXPECT_EQ(p.trainable, !buffer) << p.name;
    // Decay only conv and fc weights (rank 4 and 2), never BN parameters or biases.
    const bool decayed = ends_with(p.name, ".weight") && p.shape.size() >= 2;
    EXPECT_EQ(p.weight_decay, decayed) << p.name;
  }
}

TEST(Resnet, Resnet8ParamTable) {
  ParamStore params;
  register_resnet_params({1, 16}, params);
  // The table for resnet8 spelled out, so a systematic error in expected_params shows up here.
  // clang-format off
  const std::vector<Entry> table = {
      {"conv1.weight", {16, 1, 3, 3}},
      {"bn1.weight", {16}}, {"bn1.bias", {16}},
      {"bn1.running_mean", {16}}, {"bn1.running_var", {16}},
      {"layer1.0.conv1.weight", {16, 16, 3, 3}},
      {"layer1.0.bn1.weight", {16}}, {"layer1.0.bn1.bias", {16}},
      {"layer1.0.bn1.running_mean", {16}}, {"layer1.0.bn1.running_var", {16}},
      {"layer1.0.conv2.weight", {16, 16, 3, 3}},
      {"layer1.0.bn2.weight", {16}}, {"layer1.0.bn2.bias", {16}},
      {"layer1.0.bn2.running_mean", {16}}, {"layer1.0.bn2.running_var", {16}},
      {"layer2.0.conv1.weight", {32, 16, 3, 3}},
      {"layer2.0.bn1.weight", {32}}, {"layer2.0.bn1.bias", {32}},
      {"layer2.0.bn1.running_mean", {32}}, {"layer2.0.bn1.running_var", {32}},
      {"layer2.0.conv2.weight", {32, 32, 3, 3}},
      {"layer2.0.bn2.weight", {32}}, {"layer2.0.bn2.bias", {32}},
      {"layer2.0.bn2.running_mean", {32}}, {"layer2.0.bn2.running_var", {32}},
      {"layer2.0.downsample.0.weight", {32, 16, 1, 1}},
      {"layer2.0.downsample.1.weight", {32}}, {"layer2.0.downsample.1.bias", {32}},
      {"layer2.0.downsample.1.running_mean", {32}}, {"layer2.0.downsample.1.running_var", {32}},
      {"layer3.0.conv1.weight", {64, 32, 3, 3}},
      {"layer3.0.bn1.weight", {64}}, {"layer3.0.bn1.bias", {64}},
      {"layer3.0.bn1.running_mean", {64}}, {"layer3.0.bn1.running_var", {64}},
      {"layer3.0.conv2.weight", {64, 64, 3, 3}},
      {"layer3.0.bn2.weight", {64}}, {"layer3.0.bn2.bias", {64}},
      {"layer3.0.bn2.running_mean", {64}}, {"layer3.0.bn2.running_var", {64}},
      {"layer3.0.downsample.0.weight", {64, 32, 1, 1}},
      {"layer3.0.downsample.1.weight", {64}}, {"layer3.0.downsample.1.bias", {64}},
      {"layer3.0.downsample.1.running_mean", {64}}, {"layer3.0.downsample.1.running_var", {64}},
      {"fc.weight", {10, 64}}, {"fc.bias", {10}},
  };
  // clang-format on
  expect_params_match(params, table);
  expect_params_match(params, expected_params(1, 16));
}

TEST(Resnet, Resnet20ParamTableAndCount) {
  ParamStore params;
  register_resnet_params({3, 16}, params);
  expect_params_match(params, expected_params(3, 16));
  params.allocate();
  // Counted by hand: stem 144 + 32, layer1 14016, layer2 51648, layer3 205696, fc 650.
  EXPECT_EQ(params.num_trainable_floats(), 272186);
}

TEST(Resnet, InitialisationFollowsTorchvision) {
  ParamStore params;
  register_resnet_params({1, 16}, params);
  params.allocate();
  params.initialize(3);
  const Param& conv = params[params.find("layer3.0.conv2.weight")];
  EXPECT_FLOAT_EQ(conv.init_std, std::sqrt(2.0f / (64 * 9)));
  double squares = 0.0;
  for (int64_t i = 0; i < conv.value.numel(); ++i)
    squares += double(conv.value.data()[i]) * conv.value.data()[i];
  EXPECT_NEAR(std::sqrt(squares / conv.value.numel()), conv.init_std, 0.05 * conv.init_std);
  EXPECT_FLOAT_EQ(params[params.find("fc.weight")].init_std, 1.0f / 8.0f);
  EXPECT_EQ(params[params.find("bn1.weight")].value.data()[5], 1.0f);
  EXPECT_EQ(params[params.find("bn1.bias")].value.data()[5], 0.0f);
  EXPECT_EQ(params[params.find("bn1.running_mean")].value.data()[5], 0.0f);
  EXPECT_EQ(params[params.find("bn1.running_var")].value.data()[5], 1.0f);
  EXPECT_EQ(params[params.find("fc.bias")].value.data()[5], 0.0f);
}

TEST(Resnet, RejectsBadShapesAndMismatchedIds) {
  ParamStore params;
  EXPECT_THROW(register_resnet_params({1, 0}, params), Error);
  EXPECT_THROW(register_resnet_params({0, 16}, params), Error);
  const ResnetParamIds ids = register_resnet_params({1, 4}, params);
  EXPECT_THROW(build_resnet_graph({2, 4}, 4, ids), Error);  // ids hold 1 block per stage
  EXPECT_THROW(build_resnet_graph({1, 4}, 0, ids), Error);
}

TEST(Resnet, GraphShapes) {
  ParamStore params;
  Graph graph = build_resnet({1, 16}, 3, params);
  EXPECT_EQ(graph.shape(graph.input), (Shape{3, 1, 28, 28}));
  EXPECT_EQ(graph.shape(graph.output), (Shape{3, 10}));
  EXPECT_EQ(graph.shape(graph.loss), (Shape{1}));
  // stem 3 ops; block without shortcut 7, with 9; avgpool, fc, loss.
  EXPECT_EQ(graph.ops.size(), 3u + 7 + 9 + 9 + 3);
  auto shape_of = [&](const std::string& name) {
    for (const Value& value : graph.values)
      if (value.name == name) return value.shape;
    return Shape{};
  };
  // Activations are channels-last, [B, H, W, C].
  EXPECT_EQ(shape_of("conv1"), (Shape{3, 28, 28, 16}));
  EXPECT_EQ(shape_of("layer1.0.relu2"), (Shape{3, 28, 28, 16}));
  EXPECT_EQ(shape_of("layer2.0.relu2"), (Shape{3, 14, 14, 32}));
  EXPECT_EQ(shape_of("layer2.0.downsample.1"), (Shape{3, 14, 14, 32}));
  EXPECT_EQ(shape_of("layer3.0.relu2"), (Shape{3, 7, 7, 64}));
  EXPECT_EQ(shape_of("avgpool"), (Shape{3, 64}));
}

// softplus(x) = log(1 + e^x): a smooth stand-in for ReLU, so the whole-model check below can be
// tight. Test-only; ReluOp itself is checked in resnet_norm_test.
class SoftplusOp : public Op {
 public:
  explicit SoftplusOp(int64_t numel) : numel_(numel) {}
  OpKind op_kind() const override { return OpKind::kOther; }
  void forward(Workspace& ws, ParamStore&) override {
    const float* x = ws.values[inputs[0]].data();
    float* y = ws.values[outputs[0]].data();
    for (int64_t i = 0; i < numel_; ++i) y[i] = std::log1p(std::exp(x[i]));
  }
  // d softplus / dx = sigmoid(x).
  void backward(Workspace& ws, ParamStore&) override {
    const float* x = ws.values[inputs[0]].data();
    const float* dy = ws.grads[outputs[0]].data();
    float* dx = ws.grads[inputs[0]].data();
    for (int64_t i = 0; i < numel_; ++i) dx[i] += dy[i] / (1.0f + std::exp(-x[i]));
  }

 private:
  int64_t numel_;
};

// Replaces every ReluOp of the graph by a SoftplusOp on the same values; returns how many.
int swap_relu_for_softplus(Graph& graph) {
  int swapped = 0;
  for (auto& op : graph.ops) {
    if (op->op_kind() != OpKind::kRelu) continue;
    auto smooth = std::make_unique<SoftplusOp>(shape_numel(graph.shape(op->inputs[0])));
    smooth->name = op->name;
    smooth->inputs = op->inputs;
    smooth->outputs = op->outputs;
    op = std::move(smooth);
    ++swapped;
  }
  return swapped;
}

// 29 trainable tensors in a 1-block ResNet, 4 sampled entries each (the smallest have 4).
constexpr int kTinyResnetEntries = 29 * 4;

GradcheckOptions tiny_resnet_options() {
  GradcheckOptions options;
  options.eps = 1e-2f;
  options.samples_per_tensor = 4;
  return options;
}

// The whole model in training mode, with ReLUs swapped for softplus. BN couples the batch, so a
// perturbation moves every activation of every sample; that is the function the backward
// differentiates, so it is checked as is. With a smooth activation the central difference is
// accurate to ~2% (1.6% worst over ten seeds) even for gradients near the 1e-3 floor, where the
// float round-off of the loss over 2 eps dominates; a wiring error (a missing shortcut gradient,
// BN without its batch-statistics terms, a transposed kernel, a gradient overwritten instead of
// accumulated) gives errors of order 100%.
TEST(Resnet, GradcheckTinyResnetWithSmoothActivations) {
  TinyResnet net(4);
  ASSERT_EQ(swap_relu_for_softplus(net.graph), 7);  // stem + 2 per block
  const GradcheckReport report =
      gradcheck(net.graph, net.params, net.ws, {}, tiny_resnet_options());
  EXPECT_LT(report.max_rel_error, 5e-2f) << report.worst;
  EXPECT_GT(report.max_abs_grad, 1e-2f);
  EXPECT_EQ(report.entries_checked, kTinyResnetEntries);
}

// The same check with the real ReLUs. Every perturbation of an early parameter moves all ~60k
// activations (BN renormalises whole channels), so some ReLU inputs cross 0 inside [-eps, eps] for
// any eps that float round-off allows (the loss is float: ~1e-6 of noise over 2 eps). Each
// crossing bends the difference quotient by up to ~|dL/d(activation)|, which through a 7x7 average
// pool and a batch of 4 is ~1e-3, and stem entries see several. Measured over ten seeds at
// eps = 2e-3: errors up to ~1e-2 absolute, all on stem and stage-1 entries (17% of a 5e-2 floor).
// Hence that floor and a 30% bound: a wrong gradient still fails on any tensor whose largest
// entry (always sampled) is above the floor, and the smooth check above covers the rest.
TEST(Resnet, GradcheckTinyResnetWithRelu) {
  TinyResnet net(4);
  GradcheckOptions options = tiny_resnet_options();
  options.eps = 2e-3f;
  options.floor = 5e-2f;
  const GradcheckReport report = gradcheck(net.graph, net.params, net.ws, {}, options);
  EXPECT_LT(report.max_rel_error, 0.3f) << report.worst;
  EXPECT_GT(report.max_abs_grad, 0.1f);
  EXPECT_EQ(report.entries_checked, kTinyResnetEntries);
}

// A train graph and an eval graph (GraphMode::kEval) over the same parameters, fed the same
// images and labels.
struct EvalTwin {
  Graph graph;
  std::unique_ptr<Executor> executor;
  Workspace ws;
  EvalTwin(TinyResnet& net, int batch, GraphMode mode) {
    graph = build_resnet_graph(net.shape, batch, net.ids, mode);
    executor = std::make_unique<Executor>(graph, net.params);
    ws = executor->make_workspace();
    ws.values[graph.input].copy_from(net.ws.values[net.graph.input].rows(0, batch));
    ws.targets.assign(net.ws.targets.begin(), net.ws.targets.begin() + batch);
  }
  std::vector<float> logits() {
    executor->forward(ws);
    const Tensor& out = ws.values[graph.output];
    return std::vector<float>(out.data(), out.data() + out.numel());
  }
};

int count_kind(const Graph& graph, OpKind kind) {
  return static_cast<int>(std::count_if(graph.ops.begin(), graph.ops.end(),
                                        [&](const auto& op) { return op->op_kind() == kind; }));
}

TEST(Resnet, EvalGraphNormalisesWithRunningStatisticsOnly) {
  TinyResnet net(4);
  EvalTwin eval(net, 4, GraphMode::kEval);
  // stem 1 + 2 per block + 1 per downsampling shortcut
  EXPECT_EQ(count_kind(net.graph, OpKind::kBatchNorm), 9);
  EXPECT_EQ(count_kind(net.graph, OpKind::kBatchNormInference), 0);
  EXPECT_EQ(count_kind(eval.graph, OpKind::kBatchNorm), 0);
  EXPECT_EQ(count_kind(eval.graph, OpKind::kBatchNormInference), 9);
  EXPECT_EQ(eval.graph.mode, GraphMode::kEval);
  EXPECT_TRUE(eval.ws.grads[eval.graph.output].numel() == 0) << "eval graphs hold no gradients";
  EXPECT_THROW(eval.executor->backward(eval.ws), Error);
}

TEST(Resnet, TrainingUpdatesRunningStatsEvalDoesNotAndIsPerSample) {
  TinyResnet net(4);
  const Param& running_mean = net.params[net.ids.layers[2][0].bn2.running_mean];
  const Param& running_var = net.params[net.ids.bn1.running_var];
  net.executor->forward(net.ws);
  const float mean_after_train = running_mean.value.data()[0];
  const float var_after_train = running_var.value.data()[0];
  EXPECT_NE(mean_after_train, 0.0f);
  EXPECT_NE(var_after_train, 1.0f);

  EvalTwin eval(net, 4, GraphMode::kEval);
  const std::vector<float> eval_logits = eval.logits();
  EXPECT_EQ(running_mean.value.data()[0], mean_after_train);
  EXPECT_EQ(running_var.value.data()[0], var_after_train);

  // An eval graph treats samples independently: a batch-2 eval graph on the same parameters
  // gives the same logits for the first two images. A train graph does not (batch statistics
  // differ).
  EvalTwin small_eval(net, 2, GraphMode::kEval);
  const std::vector<float> small_eval_logits = small_eval.logits();
  for (int i = 0; i < 20; ++i) EXPECT_NEAR(small_eval_logits[i], eval_logits[i], 1e-5) << i;
  EvalTwin small_train(net, 2, GraphMode::kTrain);
  const std::vector<float> small_train_logits = small_train.logits();
  net.executor->forward(net.ws);
  float max_diff = 0.0f;
  for (int i = 0; i < 20; ++i)
    max_diff = std::max(
        max_diff, std::fabs(small_train_logits[i] - net.ws.values[net.graph.output].data()[i]));
  EXPECT_GT(max_diff, 1e-4f);
}

// Plain SGD on one fixed batch of 8 must fit it: the loss falls well below its start.
TEST(Resnet, SgdFitsAFixedBatch) {
  TinyResnet net(8);
  net.executor->forward(net.ws);
  const float initial = net.executor->loss(net.ws);
  EXPECT_GT(initial, 1.0f);
  EXPECT_LT(initial, 5.0f);
  float loss = initial;
  for (int step = 0; step < 30; ++step) {
    net.params.zero_grads();
    net.executor->forward(net.ws);
    loss = net.executor->loss(net.ws);
    net.executor->backward(net.ws);
    float* values = net.params.flat_values().data();
    const float* grads = net.params.flat_grads().data();
    for (int64_t i = 0; i < net.params.num_trainable_floats(); ++i) values[i] -= 0.3f * grads[i];
  }
  EXPECT_LT(loss, 0.3f * initial);
}

}  // namespace
}  // namespace ft

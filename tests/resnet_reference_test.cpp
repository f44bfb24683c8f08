// The whole ResNet against an independent forward in PyTorch's NCHW semantics, in double.
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

// An independent forward of the ResNet in PyTorch's NCHW semantics, in double, in training mode
// (BatchNorm on batch statistics) or eval mode (on the running statistics). The graph stores
// activations NHWC; matching logits show that every op reads channels where the builder put them.
struct NchwActivation {
  int batch, channels, height, width;
  std::vector<double> data;  // [b][c][h][w]
  double& at(int b, int c, int h, int w) { return at(b, c, h * width + w); }
  double& at(int b, int c, int position) {  // position = h * width + w
    return data[(static_cast<size_t>(b) * channels + c) * height * width + position];
  }
};

struct ReferenceResnet {
  const ParamStore& params;
  GraphMode mode = GraphMode::kTrain;
  const float* param(ParamId id) const { return params[id].value.data(); }

  NchwActivation conv(NchwActivation& x, ParamId weight, int out_channels, int kernel, int stride,
                      int padding) const {
    const int out_size = (x.height + 2 * padding - kernel) / stride + 1;
    NchwActivation y{x.batch, out_channels, out_size, out_size, {}};
    y.data.assign(static_cast<size_t>(x.batch) * out_channels * out_size * out_size, 0.0);
    const float* w = param(weight);
    for (int b = 0; b < x.batch; ++b)
      for (int o = 0; o < out_channels; ++o)
        for (int i = 0; i < out_size; ++i)
          for (int j = 0; j < out_size; ++j)
            for (int c = 0; c < x.channels; ++c)
              for (int p = 0; p < kernel; ++p)
                for (int q = 0; q < kernel; ++q) {
                  const int h = i * stride + p - padding, v = j * stride + q - padding;
                  if (h < 0 || h >= x.height || v < 0 || v >= x.width) continue;
                  y.at(b, o, i, j) +=
                      w[((o * x.channels + c) * kernel + p) * kernel + q] * x.at(b, c, h, v);
                }
    return y;
  }
  void batchnorm(NchwActivation& x, const BatchNormParamIds& ids, bool relu) const {
    const int plane = x.height * x.width;
    for (int c = 0; c < x.channels; ++c) {
      double mean = param(ids.running_mean)[c], var = param(ids.running_var)[c];
      if (mode == GraphMode::kTrain) {
        double sum = 0.0, squares = 0.0;
        for (int b = 0; b < x.batch; ++b)
          for (int i = 0; i < plane; ++i) sum += x.at(b, c, i);
        mean = sum / (x.batch * plane);
        for (int b = 0; b < x.batch; ++b)
          for (int i = 0; i < plane; ++i) squares += std::pow(x.at(b, c, i) - mean, 2);
        var = squares / (x.batch * plane);
      }
      const double invstd = 1.0 / std::sqrt(var + 1e-5);
      for (int b = 0; b < x.batch; ++b)
        for (int i = 0; i < plane; ++i) {
          double& value = x.at(b, c, i);
          value = param(ids.weight)[c] * (value - mean) * invstd + param(ids.bias)[c];
          if (relu) value = std::max(value, 0.0);
        }
    }
  }
  // Logits [batch][classes] of images [batch][1][size][size].
  std::vector<double> logits(const TinyResnet& net, const float* images) const {
    const ResnetShape& shape = net.shape;
    NchwActivation h{net.batch, 1, shape.image_size, shape.image_size, {}};
    h.data.assign(images, images + static_cast<size_t>(net.batch) * h.height * h.width);
    h = conv(h, net.ids.conv1, shape.width, 3, 1, 1);
    batchnorm(h, net.ids.bn1, true);
    for (int stage = 0; stage < 3; ++stage) {
      const BasicBlockParamIds& block = net.ids.layers[stage][0];
      const int channels = shape.width << stage, stride = stage > 0 ? 2 : 1;
      NchwActivation inner = conv(h, block.conv1, channels, 3, stride, 1);
      batchnorm(inner, block.bn1, true);
      inner = conv(inner, block.conv2, channels, 3, 1, 1);
      batchnorm(inner, block.bn2, false);
      NchwActivation shortcut = h;
      if (block.has_downsample) {
        shortcut = conv(h, block.downsample_conv, channels, 1, stride, 0);
        batchnorm(shortcut, block.downsample_bn, false);
      }
      for (size_t i = 0; i < inner.data.size(); ++i)
        inner.data[i] = std::max(inner.data[i] + shortcut.data[i], 0.0);
      h = inner;
    }
    std::vector<double> out(static_cast<size_t>(net.batch) * shape.classes);
    const float* fc = param(net.ids.fc_weight);
    for (int b = 0; b < net.batch; ++b)
      for (int k = 0; k < shape.classes; ++k) {
        double logit = param(net.ids.fc_bias)[k];
        for (int c = 0; c < h.channels; ++c) {
          double mean = 0.0;
          for (int i = 0; i < h.height * h.width; ++i) mean += h.at(b, c, i);
          logit += fc[k * h.channels + c] * mean / (h.height * h.width);
        }
        out[b * shape.classes + k] = logit;
      }
    return out;
  }
};

// Distinct gamma and beta per channel (and running statistics), so a channel read from the
// wrong place shows.
void perturb_batchnorm_params(ParamStore& params) {
  Rng rng(9);
  for (int id = 0; id < params.size(); ++id) {
    Param& p = params[id];
    if (p.shape.size() != 1 || p.name == "fc.bias") continue;  // BN gamma, beta, statistics
    const bool variance = p.name.find("running_var") != std::string::npos;
    for (int64_t i = 0; i < p.value.numel(); ++i)
      p.value.data()[i] =
          variance ? 0.5f + std::fabs(rng.normal()) : p.value.data()[i] + 0.5f * rng.normal();
  }
}

void expect_logits_match(const float* logits, const std::vector<double>& expected) {
  double largest = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(logits[i], expected[i], 1e-3 * (1.0 + std::fabs(expected[i]))) << "logit " << i;
    largest = std::max(largest, std::fabs(expected[i]));
  }
  EXPECT_GT(largest, 0.1);
}

TEST(Resnet, TrainingForwardMatchesAnNchwReference) {
  TinyResnet net(3);
  perturb_batchnorm_params(net.params);
  const std::vector<double> expected =
      ReferenceResnet{net.params}.logits(net, net.ws.values[net.graph.input].data());
  net.executor->forward(net.ws);
  expect_logits_match(net.ws.values[net.graph.output].data(), expected);
}

// The eval graph (BatchNormInferenceOp throughout) against the reference on running statistics.
TEST(Resnet, EvalForwardMatchesAnNchwReference) {
  TinyResnet net(3);
  perturb_batchnorm_params(net.params);
  const std::vector<double> expected = ReferenceResnet{net.params, GraphMode::kEval}.logits(
      net, net.ws.values[net.graph.input].data());
  Graph eval = build_resnet_graph(net.shape, net.batch, net.ids, GraphMode::kEval);
  Executor executor(eval, net.params);
  Workspace ws = executor.make_workspace();
  ws.values[eval.input].copy_from(net.ws.values[net.graph.input]);
  ws.targets = net.ws.targets;
  executor.forward(ws);
  expect_logits_match(ws.values[eval.output].data(), expected);
}
}  // namespace
}  // namespace ft

// Graphs for the BatchNormAddReluOp twin tests (tests/fusion_bn_add_relu_test.cpp on the CPU,
// tests/cuda_bn_add_relu_test.cpp on a GPU): the fused op, or its unfused chain BatchNorm2dOp
// [+ the shortcut's BatchNorm2dOp] -> ResidualAddOp -> ReluOp, over graph inputs x and r (or x_s),
// optionally with a second reader of every input before or after it, so that each input gradient
// is written fresh by the op under test or accumulated onto the other reader's.
// Thread safety: builders are pure functions of their case.
#pragma once
#include <string>
#include <vector>

#include "device_compare_util.h"
#include "fusion/ops/batchnorm_add_relu.h"
#include "model/gradcheck.h"
#include "model/ops/batchnorm.h"
#include "model/ops/relu.h"
#include "model/ops/residual.h"

namespace ft {
namespace bn_add_relu_test {

// Where the inputs' second reader (a ReLU each) sits in forward order.
enum class OtherReader { kNone, kBefore, kAfter };

struct Case {
  int batch, channels, height, width;
  bool normalised_shortcut;  // the shortcut has its own BatchNorm (a downsampling block)
  OtherReader other_reader;
};

inline std::string case_name(const Case& c) {
  static const char* const kReaders[] = {"", "_reader_before", "_reader_after"};
  return "c" + std::to_string(c.channels) + "_" + std::to_string(c.batch) + "x" +
         std::to_string(c.height) + "x" + std::to_string(c.width) +
         (c.normalised_shortcut ? "_bn_shortcut" : "_identity") +
         kReaders[static_cast<int>(c.other_reader)];
}

// The four BatchNorm params named `prefix`.*, in the order the op family reads them.
inline std::vector<ParamId> batchnorm_params(ParamStore& params, const std::string& prefix,
                                             int channels) {
  return {params.add(prefix + ".weight", {channels}, ParamInit::kOnes, 0.0f, false),
          params.add(prefix + ".bias", {channels}, ParamInit::kZeros, 0.0f, false),
          params.add_buffer(prefix + ".running_mean", {channels}, ParamInit::kZeros),
          params.add_buffer(prefix + ".running_var", {channels}, ParamInit::kOnes)};
}

// A ReLU reading each of `inputs` into "<name>_other"; returns their outputs.
inline std::vector<ValueId> add_other_readers(Graph& graph, const std::vector<ValueId>& inputs) {
  std::vector<ValueId> outputs;
  for (ValueId input : inputs) {
    const std::string name = graph.values[input].name + "_other";
    outputs.push_back(graph.add_value(name, graph.values[input].shape));
    graph.add_op<ReluOp>(name, {input}, {outputs.back()}, {}, graph.numel(input));
  }
  return outputs;
}

// graph.loss = the sum of a weighted-sum loss over each of `results`, each named after its
// result (the twin comparison pairs values by name).
inline void sum_of_losses(Graph& graph, const std::vector<ValueId>& results) {
  auto loss_of = [&](size_t i) {
    const ValueId loss = add_weighted_sum_loss(graph, results[i], 5 + i);
    graph.values[loss].name = "loss_of_" + graph.values[results[i]].name;
    return loss;
  };
  ValueId loss = loss_of(0);
  for (size_t i = 1; i < results.size(); ++i) {
    const ValueId more = loss_of(i);
    const ValueId sum = graph.add_value("loss_sum_" + std::to_string(i), {1});
    graph.add_op<ResidualAddOp>("loss_sum_" + std::to_string(i), {loss, more}, {sum}, {}, 1);
    loss = sum;
  }
  graph.loss = loss;
}

inline device_compare::GraphBuilder builder(const Case& c, bool fused) {
  return [c, fused](Graph& graph, ParamStore& params) {
    const Shape shape{c.batch, c.height, c.width, c.channels};
    const ValueId x = graph.add_value("x", shape);
    const ValueId shortcut = graph.add_value(c.normalised_shortcut ? "x_s" : "r", shape);
    const ValueId y = graph.add_value("y", shape);
    const std::vector<ParamId> main_ids = batchnorm_params(params, "bn", c.channels);
    std::vector<ParamId> shortcut_ids;
    if (c.normalised_shortcut) shortcut_ids = batchnorm_params(params, "bn_s", c.channels);
    std::vector<ValueId> results = {y};
    auto others = [&] {
      const std::vector<ValueId> outputs = add_other_readers(graph, {x, shortcut});
      results.insert(results.end(), outputs.begin(), outputs.end());
    };
    if (c.other_reader == OtherReader::kBefore) others();
    const BatchNormSettings main{0.25f, 1e-5f}, shortcut_bn{0.5f, 1e-3f};
    if (fused) {
      std::vector<ParamId> ids = main_ids;
      ids.insert(ids.end(), shortcut_ids.begin(), shortcut_ids.end());
      graph.add_op<BatchNormAddReluOp>("bn_add_relu", {x, shortcut}, {y}, ids, c.batch, c.channels,
                                       c.height, c.width, main,
                                       c.normalised_shortcut ? &shortcut_bn : nullptr);
    } else {
      const ValueId z = graph.add_value("z", shape), sum = graph.add_value("sum", shape);
      graph.add_op<BatchNorm2dOp>("bn", {x}, {z}, main_ids, c.batch, c.channels, c.height, c.width,
                                  main.momentum, main.eps);
      ValueId summand = shortcut;
      if (c.normalised_shortcut) {
        summand = graph.add_value("z_s", shape);
        graph.add_op<BatchNorm2dOp>("bn_s", {shortcut}, {summand}, shortcut_ids, c.batch,
                                    c.channels, c.height, c.width, shortcut_bn.momentum,
                                    shortcut_bn.eps);
      }
      graph.add_op<ResidualAddOp>("add", {z, summand}, {sum}, {}, shape_numel(shape));
      graph.add_op<ReluOp>("relu", {sum}, {y}, {}, shape_numel(shape));
    }
    if (c.other_reader == OtherReader::kAfter) others();
    sum_of_losses(graph, results);
  };
}

// 147 rows: a full reduction chunk of 128 and a remainder; C = 3 runs only scalar channel tails,
// 11 a vector block and a tail, 16 two vector blocks.
inline std::vector<Case> cases() {
  std::vector<Case> all;
  for (int channels : {3, 11, 16})
    for (bool normalised : {false, true})
      for (OtherReader reader : {OtherReader::kNone, OtherReader::kBefore, OtherReader::kAfter})
        all.push_back({3, channels, 7, 7, normalised, reader});
  return all;
}

}  // namespace bn_add_relu_test
}  // namespace ft

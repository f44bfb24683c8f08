// The softmax, attention and loss kernels on a GPU against their CPU kernels, through
// tests/device_compare_util.h (every value, gradient, parameter gradient and the loss):
// CausalSoftmaxOp (fresh gradients overwritten, and accumulated when another op also reads the
// scores); FlashAttentionOp at head dims 24, 64 and 128 and sequence lengths that leave partial
// 32-row tiles, with q/k/v as column views of one [rows, 3C] value and as separate roots, and
// against the eager scores -> softmax -> mix chain on cuda; SoftmaxCrossEntropyOp, with a loss
// gradient other than 1, bit-identical losses across runs and a bad target refused on the host;
// ClassifierOp in training and eval form against the CPU and against TiedLmHeadOp ->
// SoftmaxCrossEntropyOp on cuda.
// Tolerances: the kernels differ from the CPU only in summation order and in expf vs libm (a few
// ulp), so values and the short softmax sums agree to ~1e-6 relative; gradients that sum over a
// whole sequence or GEMMs that sum over channels or rows get 1e-4 relative.
// Skips without a usable device.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/device.h"
#include "cuda_test_util.h"
#include "device_compare_util.h"
#include "fusion/ops/classifier.h"
#include "fusion/ops/flash_attention.h"
#include "model/ops/attention_mix.h"
#include "model/ops/attention_scores.h"
#include "model/ops/causal_softmax.h"
#include "model/ops/cross_entropy.h"
#include "model/ops/gelu.h"
#include "model/ops/lm_head.h"

namespace ft {
namespace {

using device_compare::DeviceRun;
using device_compare::expect_runs_close;
using device_compare::run_on;

// y = a + b through host copies (a test op, like WeightedSumLossOp): lets two ops read one value
// so the op under test accumulates into a gradient instead of getting it fresh.
class AddThroughHostOp : public Op {
 public:
  OpKind op_kind() const override { return OpKind::kOther; }
  void forward(Workspace& ws, ParamStore&) override {
    std::vector<float> sum = ws.values[inputs[0]].to_host_vector();
    const std::vector<float> b = ws.values[inputs[1]].to_host_vector();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += b[i];
    Tensor& y = ws.values[outputs[0]];
    y.copy_from(Tensor::wrap(sum.data(), y.shape()));
  }
  void backward(Workspace& ws, ParamStore&) override {
    const std::vector<float> dy = ws.grads[outputs[0]].to_host_vector();
    for (ValueId id : inputs) {
      std::vector<float> dx = ws.grads[id].to_host_vector();
      for (size_t i = 0; i < dx.size(); ++i) dx[i] += dy[i];
      ws.grads[id].copy_from(Tensor::wrap(dx.data(), ws.grads[id].shape()));
    }
  }
};

void expect_cuda_matches_cpu(const device_compare::GraphBuilder& build,
                             const device_compare::BatchIds& ids, double rtol, double atol) {
  const DeviceRun cpu = run_on(Device::kCpu, build, ids);
  const DeviceRun cuda = run_on(test::kGpu, build, ids);
  expect_runs_close(cuda, cpu, rtol, atol);
}

TEST(CudaAttention, CausalSoftmaxMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  for (int T : {1, 5, 32, 77}) {  // one key; under, exactly and over a warp's 32 lanes
    SCOPED_TRACE("T " + std::to_string(T));
    auto build = [T](Graph& graph, ParamStore&) {
      const ValueId scores = graph.add_value("scores", {2, 3, T, T});
      const ValueId probs = graph.add_value("probs", {2, 3, T, T});
      graph.add_op<CausalSoftmaxOp>("softmax", {scores}, {probs}, {}, 2, 3, T);
      add_weighted_sum_loss(graph, probs, 5);
    };
    expect_cuda_matches_cpu(build, {}, 1e-5, 1e-6);
  }
}

TEST(CudaAttention, CausalSoftmaxAccumulatesIntoAGradientOthersAlsoWrite) {
  FT_SKIP_WITHOUT_GPU();
  auto build = [](Graph& graph, ParamStore&) {
    constexpr int T = 45;
    const ValueId scores = graph.add_value("scores", {2, 2, T, T});
    const ValueId probs = graph.add_value("probs", {2, 2, T, T});
    const ValueId activated = graph.add_value("activated", {2, 2, T, T});
    const ValueId sum = graph.add_value("sum", {2, 2, T, T});
    const int64_t numel = 2 * 2 * T * T;
    graph.add_op<CausalSoftmaxOp>("softmax", {scores}, {probs}, {}, 2, 2, T);
    graph.add_op<GeluOp>("gelu", {scores}, {activated}, {}, numel);  // the last reader
    graph.add_op<AddThroughHostOp>("add", {probs, activated}, {sum}, {});
    add_weighted_sum_loss(graph, sum, 6);
  };
  expect_cuda_matches_cpu(build, {}, 1e-5, 1e-6);
}

struct AttentionShape {
  int B, T, C, NH;
};

// q, k, v as views at columns 0, C, 2C of one [rows, 3C] value, or as three roots; y [rows, C].
// With `second_reader`, q also feeds a GELU, so FlashAttentionOp accumulates into dq.
device_compare::GraphBuilder flash_graph(AttentionShape s, bool views, bool second_reader = false) {
  return [s, views, second_reader](Graph& graph, ParamStore&) {
    const int64_t rows = static_cast<int64_t>(s.B) * s.T;
    ValueId q, k, v;
    if (views) {
      const ValueId qkv = graph.add_value("qkv", {rows, 3 * s.C});
      q = graph.add_view("q", qkv, 0, s.C);
      k = graph.add_view("k", qkv, s.C, s.C);
      v = graph.add_view("v", qkv, 2 * s.C, s.C);
    } else {
      q = graph.add_value("q", {rows, s.C});
      k = graph.add_value("k", {rows, s.C});
      v = graph.add_value("v", {rows, s.C});
    }
    const ValueId y = graph.add_value("y", {rows, s.C});
    graph.add_op<FlashAttentionOp>("attn", {q, k, v}, {y}, {}, s.B, s.T, s.C, s.NH, 16);
    ValueId loss_input = y;
    if (second_reader) {
      const ValueId activated = graph.add_value("activated", {rows, s.C});
      const ValueId sum = graph.add_value("sum", {rows, s.C});
      graph.add_op<GeluOp>("gelu", {q}, {activated}, {}, rows * s.C);
      graph.add_op<AddThroughHostOp>("add", {y, activated}, {sum}, {});
      loss_input = sum;
    }
    add_weighted_sum_loss(graph, loss_input, 8);
  };
}

TEST(CudaAttention, FlashAttentionMatchesCpuOnViewsAndRoots) {
  FT_SKIP_WITHOUT_GPU();
  // head dims 24 (not a multiple of 32), 64 and 128 (the kernel's limit); T leaving a partial
  // tile, T under one tile, T of exactly two tiles.
  for (AttentionShape s : {AttentionShape{2, 45, 72, 3}, AttentionShape{1, 70, 128, 2},
                           AttentionShape{2, 7, 256, 2}, AttentionShape{1, 64, 256, 2}}) {
    for (bool views : {true, false}) {
      SCOPED_TRACE("T " + std::to_string(s.T) + " head_dim " + std::to_string(s.C / s.NH) +
                   (views ? " views" : " roots"));
      expect_cuda_matches_cpu(flash_graph(s, views), {}, 1e-4, 1e-5);
    }
  }
}

TEST(CudaAttention, FlashAttentionAccumulatesIntoAGradientOthersAlsoWrite) {
  FT_SKIP_WITHOUT_GPU();
  expect_cuda_matches_cpu(flash_graph({2, 40, 64, 2}, false, true), {}, 1e-4, 1e-5);
}

TEST(CudaAttention, FlashAttentionRefusesHeadsWiderThan128) {
  FT_GPU_ONLY();
  EXPECT_THROW(run_on(test::kGpu, flash_graph({1, 8, 264, 1}, false), {}), Error);
}

// The y and the q/k/v gradient of a run, looked up by name (the eager graph has more values).
const std::vector<float>& named(const DeviceRun& run, const std::string& name, bool grad) {
  for (size_t i = 0; i < run.names.size(); ++i)
    if (run.names[i] == name) return grad ? run.grads[i] : run.values[i];
  ADD_FAILURE() << "no value " << name;
  static const std::vector<float> none;
  return none;
}

TEST(CudaAttention, FlashAttentionMatchesTheEagerChainOnCuda) {
  FT_SKIP_WITHOUT_GPU();
  const AttentionShape s{2, 50, 128, 4};
  auto eager = [s](Graph& graph, ParamStore&) {
    const int64_t rows = static_cast<int64_t>(s.B) * s.T;
    const ValueId qkv = graph.add_value("qkv", {rows, 3 * s.C});  // the same ids as flash_graph
    const ValueId q = graph.add_view("q", qkv, 0, s.C);
    const ValueId k = graph.add_view("k", qkv, s.C, s.C);
    const ValueId v = graph.add_view("v", qkv, 2 * s.C, s.C);
    const ValueId y = graph.add_value("y", {rows, s.C});
    const ValueId scores = graph.add_value("scores", {s.B, s.NH, s.T, s.T});
    const ValueId probs = graph.add_value("probs", {s.B, s.NH, s.T, s.T});
    graph.add_op<AttentionScoresOp>("scores", {q, k}, {scores}, {}, s.B, s.T, s.C, s.NH);
    graph.add_op<CausalSoftmaxOp>("softmax", {scores}, {probs}, {}, s.B, s.NH, s.T);
    graph.add_op<AttentionMixOp>("mix", {probs, v}, {y}, {}, s.B, s.T, s.C, s.NH);
    add_weighted_sum_loss(graph, y, 8);
  };
  const DeviceRun fused = run_on(test::kGpu, flash_graph(s, true), {});
  const DeviceRun unfused = run_on(test::kGpu, eager, {});
  ASSERT_EQ(named(fused, "qkv", false), named(unfused, "qkv", false));  // the same inputs
  const double rtol = 1e-4, atol = 1e-5;
  EXPECT_EQ(device_compare::difference("y", named(fused, "y", false), named(unfused, "y", false),
                                       rtol, atol),
            "");
  EXPECT_EQ(device_compare::difference("grad of qkv", named(fused, "qkv", true),
                                       named(unfused, "qkv", true), rtol, atol),
            "");
  EXPECT_NEAR(fused.loss, unfused.loss, 1e-4 * std::fabs(unfused.loss) + 1e-5);
}

// Targets that cover every class range end: 0, classes - 1 and a spread in between.
device_compare::BatchIds class_targets(int64_t rows, int64_t classes) {
  device_compare::BatchIds ids;
  for (int64_t row = 0; row < rows; ++row)
    ids.targets.push_back(static_cast<int32_t>(row == 0 ? classes - 1 : (row * 37) % classes));
  return ids;
}

// logits -> cross-entropy; with `weighted`, the loss goes through a weighted sum so its
// gradient is a random number instead of 1.
device_compare::GraphBuilder cross_entropy_graph(int64_t rows, int64_t classes, bool weighted) {
  return [rows, classes, weighted](Graph& graph, ParamStore&) {
    const ValueId logits = graph.add_value("logits", {rows, classes});
    const ValueId loss = graph.add_value("loss", {1});
    graph.add_op<SoftmaxCrossEntropyOp>("cross_entropy", {logits}, {loss}, {}, rows, classes);
    if (weighted)
      add_weighted_sum_loss(graph, loss, 3);
    else
      graph.loss = loss;
  };
}

TEST(CudaAttention, CrossEntropyMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  // ResNet's 10 classes (fewer than a warp), GPT's 256 bytes, and more classes than threads.
  for (int64_t classes : {10, 256, 1000}) {
    for (bool weighted : {false, true}) {
      SCOPED_TRACE(std::to_string(classes) + " classes" + (weighted ? ", weighted" : ""));
      expect_cuda_matches_cpu(cross_entropy_graph(37, classes, weighted),
                              class_targets(37, classes), 1e-5, 1e-6);
    }
  }
}

TEST(CudaAttention, CrossEntropyLossIsTheSameBitsEveryRun) {
  FT_SKIP_WITHOUT_GPU();
  const auto build = cross_entropy_graph(2000, 256, false);
  const auto ids = class_targets(2000, 256);
  const DeviceRun first = run_on(test::kGpu, build, ids);
  const DeviceRun second = run_on(test::kGpu, build, ids);
  EXPECT_EQ(first.loss, second.loss);
  EXPECT_EQ(first.grads, second.grads);
}

TEST(CudaAttention, CrossEntropyChecksTargetsOnTheHost) {
  FT_SKIP_WITHOUT_GPU();
  device_compare::BatchIds ids = class_targets(9, 10);
  ids.targets[4] = 10;
  EXPECT_THROW(run_on(test::kGpu, cross_entropy_graph(9, 10, false), ids), Error);
  ids.targets[4] = -1;
  EXPECT_THROW(run_on(test::kGpu, cross_entropy_graph(9, 10, false), ids), Error);
}

struct ClassifierShape {
  int64_t rows, channels, vocab;
};

// x [rows, C] -> logits [rows, V], loss: the fused ClassifierOp or TiedLmHeadOp ->
// SoftmaxCrossEntropyOp, over the same values (x, logits, loss) in the same order.
device_compare::GraphBuilder classifier_graph(ClassifierShape s, bool fused, GraphMode mode,
                                              bool weighted = false) {
  return [s, fused, mode, weighted](Graph& graph, ParamStore& params) {
    graph.mode = mode;
    const ValueId x = graph.add_value("x", {s.rows, s.channels});
    const ValueId logits = graph.add_value("logits", {s.rows, s.vocab});
    const ValueId loss = graph.add_value("loss", {1});
    const ParamId wte = params.add("wte", {s.vocab, s.channels}, ParamInit::kNormal, 0.02f, true);
    if (fused) {
      graph.add_op<ClassifierOp>("classifier", {x}, {logits, loss}, {wte}, s.rows, s.channels,
                                 s.vocab, 16,
                                 mode == GraphMode::kTrain ? ClassifierForward::kLossAndDlogits
                                                           : ClassifierForward::kLossOnly);
    } else {
      graph.add_op<TiedLmHeadOp>("lm_head", {x}, {logits}, {wte}, s.rows, s.channels, s.vocab);
      graph.add_op<SoftmaxCrossEntropyOp>("cross_entropy", {logits}, {loss}, {}, s.rows, s.vocab);
    }
    graph.output = logits;
    if (weighted)
      add_weighted_sum_loss(graph, loss, 4);
    else
      graph.loss = loss;
  };
}

TEST(CudaAttention, ClassifierMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  for (ClassifierShape s : {ClassifierShape{37, 16, 50}, ClassifierShape{64, 128, 256},
                            ClassifierShape{20, 64, 1500}}) {
    SCOPED_TRACE(std::to_string(s.rows) + " rows, vocab " + std::to_string(s.vocab));
    const auto ids = class_targets(s.rows, s.vocab);
    expect_cuda_matches_cpu(classifier_graph(s, true, GraphMode::kTrain), ids, 1e-4, 1e-5);
    expect_cuda_matches_cpu(classifier_graph(s, true, GraphMode::kEval), ids, 1e-4, 1e-5);
  }
}

TEST(CudaAttention, ClassifierScalesByALossGradientOtherThanOne) {
  FT_SKIP_WITHOUT_GPU();
  const ClassifierShape s{33, 32, 70};
  expect_cuda_matches_cpu(classifier_graph(s, true, GraphMode::kTrain, true),
                          class_targets(s.rows, s.vocab), 1e-4, 1e-5);
}

TEST(CudaAttention, ClassifierMatchesLmHeadThenCrossEntropyOnCuda) {
  FT_SKIP_WITHOUT_GPU();
  const ClassifierShape s{64, 128, 256};
  const auto ids = class_targets(s.rows, s.vocab);
  for (GraphMode mode : {GraphMode::kTrain, GraphMode::kEval}) {
    DeviceRun fused = run_on(test::kGpu, classifier_graph(s, true, mode), ids);
    DeviceRun unfused = run_on(test::kGpu, classifier_graph(s, false, mode), ids);
    // The fused op keeps dlogits to itself: nothing reads the logits' gradient after it, so its
    // buffer is never written there, while the unfused chain passes dlogits through it.
    for (DeviceRun* run : {&fused, &unfused})
      for (size_t v = 0; v < run->names.size(); ++v)
        if (run->names[v] == "logits") run->grads[v].clear();
    expect_runs_close(fused, unfused, 1e-4, 1e-5);
  }
}

TEST(CudaAttention, ClassifierChecksTargetsOnTheHost) {
  FT_SKIP_WITHOUT_GPU();
  device_compare::BatchIds ids = class_targets(8, 20);
  ids.targets[3] = 20;
  EXPECT_THROW(run_on(test::kGpu, classifier_graph({8, 16, 20}, true, GraphMode::kTrain), ids),
               Error);
}

}  // namespace
}  // namespace ft

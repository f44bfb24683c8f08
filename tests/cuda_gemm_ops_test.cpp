// The GEMM-based ops on a GPU against their CPU kernels through tests/device_compare_util.h:
// Linear (with a bias, a weight row offset and a column-view input), the fused QKV Linear, the
// tied LM head, Linear + GELU (training and eval forms, and fused against its unfused twin
// LinearOp -> GeluOp on cuda), and the attention scores and mix GEMMs, including q, k and v as
// column views of one QKV-style [rows, 3C] value and more sequences than heads. FP32 throughout
// (train.tf32 off). Skips without a usable device.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/gemm.h"
#include "cuda_test_util.h"
#include "device_compare_util.h"
#include "fusion/ops/linear_gelu.h"
#include "fusion/ops/qkv_linear.h"
#include "model/ops/attention_mix.h"
#include "model/ops/attention_scores.h"
#include "model/ops/gelu.h"
#include "model/ops/linear.h"
#include "model/ops/lm_head.h"

namespace ft {
namespace {

using device_compare::GraphBuilder;

// cuBLASLt and oneDNN sum the K products in different orders: with K <= 96 and operands of
// magnitude ~1, FP32 rounding differences stay around 1e-5 of the largest term.
constexpr double kRtol = 1e-4, kAtol = 1e-4;

void expect_cuda_matches_cpu(const GraphBuilder& build) {
  ASSERT_FALSE(gemm_tf32());
  const auto cpu = device_compare::run_on(Device::kCpu, build, {});
  const auto cuda = device_compare::run_on(test::kGpu, build, {});
  device_compare::expect_runs_close(cuda, cpu, kRtol, kAtol);
}

struct LinearShape {
  int64_t rows, in, out;
  bool has_bias;
  int64_t weight_row_offset;
  int64_t x_extra_columns;  // > 0: x is a column view (at column 1) of a wider root
};

// The x of a Linear-family op: a root, or a column view of a wider root.
ValueId linear_input(Graph& graph, const LinearShape& s) {
  if (s.x_extra_columns == 0) return graph.add_value("x", {s.rows, s.in});
  const ValueId root = graph.add_value("x.root", {s.rows, s.in + s.x_extra_columns});
  return graph.add_view("x", root, 1, s.in);
}

std::vector<ParamId> linear_params(ParamStore& params, const LinearShape& s) {
  const int64_t weight_rows = s.weight_row_offset + s.out + 2;
  std::vector<ParamId> ids{params.add("w", {weight_rows, s.in}, ParamInit::kNormal, 0.5f, true)};
  if (s.has_bias) ids.push_back(params.add("b", {weight_rows}, ParamInit::kZeros, 0.0f, false));
  return ids;
}

GraphBuilder linear_graph(const LinearShape& s) {
  return [s](Graph& graph, ParamStore& params) {
    const ValueId x = linear_input(graph, s);
    const ValueId y = graph.add_value("y", {s.rows, s.out});
    graph.add_op<LinearOp>("linear", {x}, {y}, linear_params(params, s), s.rows, s.in, s.out,
                           s.has_bias, s.weight_row_offset);
    add_weighted_sum_loss(graph, y, 3);
  };
}

TEST(CudaGemmOps, LinearMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  expect_cuda_matches_cpu(linear_graph({37, 48, 40, true, 0, 0}));
  expect_cuda_matches_cpu(linear_graph({16, 32, 64, false, 0, 0}));
  // A bias at row offset 3 is not 16-byte aligned: the unfused bias kernel runs.
  expect_cuda_matches_cpu(linear_graph({21, 24, 13, true, 3, 0}));
  expect_cuda_matches_cpu(linear_graph({19, 32, 24, true, 8, 5}));
}

TEST(CudaGemmOps, QkvLinearMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  for (const int64_t extra : {int64_t{0}, int64_t{3}}) {
    SCOPED_TRACE(extra);
    const LinearShape s{18, 32, 3 * 16, true, 0, extra};
    expect_cuda_matches_cpu([s](Graph& graph, ParamStore& params) {
      const ValueId x = linear_input(graph, s);
      const ValueId qkv = graph.add_value("qkv", {s.rows, s.out});
      graph.add_op<QkvLinearOp>("qkv", {x}, {qkv}, linear_params(params, s), s.rows, s.in,
                                int64_t{16}, 3, true, int64_t{0});
      add_weighted_sum_loss(graph, qkv, 4);
    });
  }
}

TEST(CudaGemmOps, TiedLmHeadMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  expect_cuda_matches_cpu([](Graph& graph, ParamStore& params) {
    const ValueId x = graph.add_value("x", {24, 32});
    const ValueId logits = graph.add_value("logits", {24, 75});
    const ParamId wte = params.add("wte", {75, 32}, ParamInit::kNormal, 0.5f, true);
    graph.add_op<TiedLmHeadOp>("lm_head", {x}, {logits}, {wte}, int64_t{24}, int64_t{32},
                               int64_t{75});
    add_weighted_sum_loss(graph, logits, 5);
  });
}

GraphBuilder linear_gelu_graph(const LinearShape& s, bool fused, GraphMode mode) {
  return [s, fused, mode](Graph& graph, ParamStore& params) {
    graph.mode = mode;
    const ValueId x = linear_input(graph, s);
    const ValueId y = graph.add_value("y", {s.rows, s.out});
    if (fused) {
      graph.add_op<LinearGeluOp>("c_fc_gelu", {x}, {y}, linear_params(params, s), s.rows, s.in,
                                 s.out, s.has_bias, s.weight_row_offset, 8,
                                 mode == GraphMode::kTrain
                                     ? LinearGeluForward::kTiledKeepPreactivation
                                     : LinearGeluForward::kGeluPostOp);
    } else {
      const ValueId pre = graph.add_value("pre", {s.rows, s.out});
      graph.add_op<LinearOp>("c_fc", {x}, {pre}, linear_params(params, s), s.rows, s.in, s.out,
                             s.has_bias, s.weight_row_offset);
      graph.add_op<GeluOp>("gelu", {pre}, {y}, {}, s.rows * s.out);
    }
    add_weighted_sum_loss(graph, y, 6);
  };
}

TEST(CudaGemmOps, LinearGeluMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  // out % 8 == 0 lets cuBLASLt fuse GELU_AUX_BIAS; out = 20 takes the unfused aux kernel.
  for (const LinearShape& s :
       {LinearShape{37, 48, 64, true, 0, 0}, LinearShape{29, 24, 20, true, 4, 3},
        LinearShape{16, 16, 32, false, 0, 0}}) {
    SCOPED_TRACE(s.out);
    expect_cuda_matches_cpu(linear_gelu_graph(s, true, GraphMode::kTrain));
    expect_cuda_matches_cpu(linear_gelu_graph(s, true, GraphMode::kEval));
  }
}

// The index of value `name` in a run.
size_t value_index(const device_compare::DeviceRun& run, const std::string& name) {
  const auto found = std::find(run.names.begin(), run.names.end(), name);
  EXPECT_NE(found, run.names.end()) << name;
  return static_cast<size_t>(found - run.names.begin());
}

TEST(CudaGemmOps, LinearGeluFusedMatchesUnfusedOnCuda) {
  FT_SKIP_WITHOUT_GPU();
  const LinearShape s{40, 32, 48, true, 0, 2};
  const auto fused =
      device_compare::run_on(test::kGpu, linear_gelu_graph(s, true, GraphMode::kTrain), {});
  const auto unfused =
      device_compare::run_on(test::kGpu, linear_gelu_graph(s, false, GraphMode::kTrain), {});
  std::vector<std::string> differences;
  auto note = [&](std::string text) {
    if (!text.empty()) differences.push_back(std::move(text));
  };
  for (const std::string name : {"x.root", "y"}) {
    const size_t f = value_index(fused, name), u = value_index(unfused, name);
    note(device_compare::difference("value " + name, fused.values[f], unfused.values[u], kRtol,
                                    kAtol));
    note(device_compare::difference("grad of " + name, fused.grads[f], unfused.grads[u], kRtol,
                                    kAtol));
  }
  note(device_compare::difference("parameter gradients", fused.param_grads, unfused.param_grads,
                                  kRtol, kAtol));
  note(device_compare::difference("loss", {fused.loss}, {unfused.loss}, kRtol, kAtol));
  for (const std::string& text : differences) ADD_FAILURE() << text;
}

struct AttentionShape {
  int batch, seq_len, channels, n_head;
  bool qkv_views;  // q, k, v as column views of one [B*T, 3C] value
};

// Adds q, k, v: three roots, or three views of one QKV-style root.
std::vector<ValueId> attention_inputs(Graph& graph, const AttentionShape& s) {
  const int64_t rows = static_cast<int64_t>(s.batch) * s.seq_len, C = s.channels;
  if (!s.qkv_views)
    return {graph.add_value("q", {rows, C}), graph.add_value("k", {rows, C}),
            graph.add_value("v", {rows, C})};
  const ValueId qkv = graph.add_value("qkv", {rows, 3 * C});
  return {graph.add_view("q", qkv, 0, C), graph.add_view("k", qkv, C, C),
          graph.add_view("v", qkv, 2 * C, C)};
}

Shape scores_shape(const AttentionShape& s) {
  const int64_t T = s.seq_len;
  return {static_cast<int64_t>(s.batch), static_cast<int64_t>(s.n_head), T, T};
}

GraphBuilder attention_scores_graph(const AttentionShape& s, bool k_is_q) {
  return [s, k_is_q](Graph& graph, ParamStore&) {
    const std::vector<ValueId> qkv = attention_inputs(graph, s);
    const ValueId scores = graph.add_value("scores", scores_shape(s));
    graph.add_op<AttentionScoresOp>("scores", {qkv[0], k_is_q ? qkv[0] : qkv[1]}, {scores}, {},
                                    s.batch, s.seq_len, s.channels, s.n_head);
    add_weighted_sum_loss(graph, scores, 7);
  };
}

GraphBuilder attention_mix_graph(const AttentionShape& s) {
  return [s](Graph& graph, ParamStore&) {
    const std::vector<ValueId> qkv = attention_inputs(graph, s);
    const ValueId probs = graph.add_value("probs", scores_shape(s));
    const ValueId y = graph.add_value("y", {static_cast<int64_t>(s.batch) * s.seq_len, s.channels});
    graph.add_op<AttentionMixOp>("mix", {probs, qkv[2]}, {y}, {}, s.batch, s.seq_len, s.channels,
                                 s.n_head);
    add_weighted_sum_loss(graph, y, 8);
  };
}

// Head batches (batch <= n_head), sequence batches (batch > n_head), and hd = 6, whose head
// offsets are only 8-byte aligned.
std::vector<AttentionShape> attention_shapes() {
  return {{2, 16, 32, 4, false}, {2, 16, 32, 4, true}, {5, 12, 24, 2, true}, {3, 10, 18, 3, true}};
}

TEST(CudaGemmOps, AttentionScoresMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  for (const AttentionShape& s : attention_shapes()) {
    SCOPED_TRACE(testing::Message() << "B=" << s.batch << " NH=" << s.n_head << " C=" << s.channels
                                    << " views=" << s.qkv_views);
    expect_cuda_matches_cpu(attention_scores_graph(s, false));
  }
  // q and k one value: dk adds to the dq just written.
  expect_cuda_matches_cpu(attention_scores_graph({2, 8, 16, 2, false}, true));
}

TEST(CudaGemmOps, AttentionMixMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  for (const AttentionShape& s : attention_shapes()) {
    SCOPED_TRACE(testing::Message() << "B=" << s.batch << " NH=" << s.n_head << " C=" << s.channels
                                    << " views=" << s.qkv_views);
    expect_cuda_matches_cpu(attention_mix_graph(s));
  }
}

}  // namespace
}  // namespace ft

// The GPT elementwise and normalisation ops on a GPU against their CPU kernels, through
// tests/device_compare_util.h (every value, gradient, parameter gradient and the loss):
// embedding, LayerNorm (also on column views), residual add, dropout, and the fused
// ResidualLayerNormOp and BatchedLayerNormOp, which are also compared with their unfused chains on
// cuda. Dropout masks must equal the CPU's exactly. Skips without a usable device.
// Tolerances: the embedding, the residual add and dropout do the same float operations in the
// same order on both devices (the embedding's backward has no atomics, see embedding.h), so they
// must agree exactly. LayerNorm's row sums run in another order on the GPU (lane partial sums and
// a warp tree instead of vector partial sums), which moves results by a few ulp of the row's
// statistics: rtol 1e-4 with atol 1e-5 for values of order 1 (gradients through the two row means
// lose a further digit to cancellation, parameter gradients sum up to 64 rows).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "cuda_test_util.h"
#include "device_compare_util.h"
#include "fusion/ops/batched_layernorm.h"
#include "fusion/ops/residual_layernorm.h"
#include "model/ops/dropout.h"
#include "model/ops/embedding.h"
#include "model/ops/layernorm.h"
#include "model/ops/residual.h"

namespace ft {
namespace {

using device_compare::DeviceRun;
using device_compare::expect_runs_close;
using device_compare::GraphBuilder;
using device_compare::run_on;

constexpr double kExact = 0.0;
constexpr double kExactAtol = 1e-30;  // any difference at all fails
constexpr double kNormRtol = 1e-4, kNormAtol = 1e-5;

void expect_devices_agree(const GraphBuilder& build, double rtol, double atol,
                          const device_compare::BatchIds& ids = {}) {
  const DeviceRun cpu = run_on(Device::kCpu, build, ids);
  const DeviceRun cuda = run_on(test::kGpu, build, ids);
  expect_runs_close(cuda, cpu, rtol, atol);
}

// Fused against unfused graphs on one device: every value the two graphs both name, its gradient
// (except those in `internal_grads`, whose buffers hold different partial sums by design), the
// parameter gradients (both graphs register the same parameters in the same order) and the loss.
// REQUIRES: at least `min_shared` values in common, so a renamed value cannot pass vacuously.
void expect_shared_values_close(const DeviceRun& fused, const DeviceRun& unfused, double rtol,
                                double atol, size_t min_shared,
                                const std::vector<std::string>& internal_grads = {}) {
  size_t shared = 0;
  for (size_t v = 0; v < fused.names.size(); ++v)
    for (size_t u = 0; u < unfused.names.size(); ++u) {
      if (fused.names[v] != unfused.names[u]) continue;
      ++shared;
      const std::string& name = fused.names[v];
      std::string text = device_compare::difference("value " + name, fused.values[v],
                                                    unfused.values[u], rtol, atol);
      if (!text.empty()) ADD_FAILURE() << text;
      if (std::find(internal_grads.begin(), internal_grads.end(), name) != internal_grads.end())
        continue;
      text = device_compare::difference("grad of " + name, fused.grads[v], unfused.grads[u], rtol,
                                        atol);
      if (!text.empty()) ADD_FAILURE() << text;
    }
  EXPECT_GE(shared, min_shared);
  const std::string params = device_compare::difference("parameter gradients", fused.param_grads,
                                                        unfused.param_grads, rtol, atol);
  if (!params.empty()) ADD_FAILURE() << params;
  const std::string loss =
      device_compare::difference("loss", {fused.loss}, {unfused.loss}, rtol, atol);
  if (!loss.empty()) ADD_FAILURE() << loss;
}

std::vector<int32_t> random_tokens(int64_t count, int vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int32_t& token : tokens) token = static_cast<int32_t>(rng.below(vocab));
  tokens[0] = vocab - 1;  // the last table row
  tokens[1] = tokens[2];  // a repeat at least
  return tokens;
}

// ---- embedding -------------------------------------------------------------------------------

GraphBuilder embedding_graph(int batch, int seq_len, int channels, int vocab) {
  return [=](Graph& graph, ParamStore& params) {
    const ParamId wte = params.add("wte", {vocab, channels}, ParamInit::kNormal, 0.02f, true);
    const ParamId wpe = params.add("wpe", {seq_len, channels}, ParamInit::kNormal, 0.02f, true);
    const ValueId x = graph.add_value("x", {batch, seq_len, channels});
    graph.add_op<EmbeddingOp>("embedding", {}, {x}, {wte, wpe}, batch, seq_len, channels);
    add_weighted_sum_loss(graph, x, 3);
  };
}

TEST(CudaGptOps, EmbeddingMatchesCpuExactly) {
  FT_SKIP_WITHOUT_GPU();
  for (const int channels : {40, 300}) {
    device_compare::BatchIds ids;
    ids.tokens = random_tokens(3 * 17, 29, 5);
    expect_devices_agree(embedding_graph(3, 17, channels, 29), kExact, kExactAtol, ids);
  }
}

TEST(CudaGptOps, EmbeddingRejectsTokensOutsideTheVocabularyOnCuda) {
  FT_SKIP_WITHOUT_GPU();
  device_compare::BatchIds ids;
  ids.tokens = random_tokens(2 * 5, 7, 9);
  ids.tokens[6] = 7;
  EXPECT_THROW(run_on(test::kGpu, embedding_graph(2, 5, 8, 7), ids), Error);
  ids.tokens[6] = -1;
  EXPECT_THROW(run_on(test::kGpu, embedding_graph(2, 5, 8, 7), ids), Error);
}

// ---- LayerNorm -------------------------------------------------------------------------------

TEST(CudaGptOps, LayerNormMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  for (const auto& [rows, channels] :
       std::vector<std::pair<int64_t, int64_t>>{{37, 129}, {64, 768}, {5, 16}, {9, 1}}) {
    SCOPED_TRACE("rows " + std::to_string(rows) + " channels " + std::to_string(channels));
    expect_devices_agree(
        [rows = rows, channels = channels](Graph& graph, ParamStore& params) {
          const ValueId x = graph.add_value("x", {rows, channels});
          const ValueId y = graph.add_value("y", {rows, channels});
          const ParamId w = params.add("ln.weight", {channels}, ParamInit::kOnes, 0.0f, false);
          const ParamId b = params.add("ln.bias", {channels}, ParamInit::kZeros, 0.0f, false);
          graph.add_op<LayerNormOp>("ln", {x}, {y}, {w, b}, rows, channels);
          add_weighted_sum_loss(graph, y, 5);
        },
        kNormRtol, kNormAtol);
  }
}

// One head's columns of a wider buffer in, and out into the columns of another.
TEST(CudaGptOps, LayerNormOnColumnViewsMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  const int64_t rows = 33, head = 32;
  expect_devices_agree(
      [=](Graph& graph, ParamStore& params) {
        const ValueId qkv = graph.add_value("qkv", {rows, 3 * head});
        const ValueId k = graph.add_view("k", qkv, head, head);
        const ValueId out = graph.add_value("out", {rows, 2 * head});
        const ValueId k_normed = graph.add_view("k_normed", out, head, head);
        const ParamId w = params.add("ln.weight", {head}, ParamInit::kOnes, 0.0f, false);
        const ParamId b = params.add("ln.bias", {head}, ParamInit::kZeros, 0.0f, false);
        graph.add_op<LayerNormOp>("ln", {k}, {k_normed}, {w, b}, rows, head);
        add_weighted_sum_loss(graph, out, 6);
      },
      kNormRtol, kNormAtol);
}

// ---- residual add and dropout ------------------------------------------------------------------

// out1 = a + b, out2 = out1 + a: a's gradient is written fresh by the second add and accumulated
// by the first; b's and out1's are fresh.
TEST(CudaGptOps, ResidualAddMatchesCpuExactly) {
  FT_SKIP_WITHOUT_GPU();
  const int64_t numel = 4099;
  expect_devices_agree(
      [=](Graph& graph, ParamStore&) {
        const ValueId a = graph.add_value("a", {numel});
        const ValueId b = graph.add_value("b", {numel});
        const ValueId out1 = graph.add_value("out1", {numel});
        const ValueId out2 = graph.add_value("out2", {numel});
        graph.add_op<ResidualAddOp>("add1", {a, b}, {out1}, {}, numel);
        graph.add_op<ResidualAddOp>("add2", {out1, a}, {out2}, {}, numel);
        add_weighted_sum_loss(graph, out2, 7);
      },
      kExact, kExactAtol);
}

GraphBuilder dropout_graph(int64_t numel, float p) {
  return [=](Graph& graph, ParamStore&) {
    const ValueId x = graph.add_value("x", {numel});
    const ValueId y = graph.add_value("y", {numel});
    graph.add_op<DropoutOp>("dropout", {x}, {y}, {}, numel, p, uint64_t{0x5eed});
    add_weighted_sum_loss(graph, y, 8);
  };
}

// y and dx are exactly 0 where the mask drops, so the exact comparison covers the mask too.
TEST(CudaGptOps, DropoutMatchesCpuExactly) {
  FT_SKIP_WITHOUT_GPU();
  for (const float p : {0.0f, 0.25f, 0.9f}) {
    SCOPED_TRACE("p " + std::to_string(p));
    expect_devices_agree(dropout_graph(4773, p), kExact, kExactAtol);  // 4773: not a multiple of 4
  }
}

// The saved masks themselves, read back from the ops: DropoutOp's on cuda and on the CPU, and the
// fused ResidualLayerNormOp's on cuda, which hashes the same (seed ^ salt, element index).
std::vector<uint8_t> forward_mask(Device device, bool fused, int64_t rows, int64_t channels,
                                  float p, uint64_t salt) {
  Graph graph;
  ParamStore params;
  const ValueId x = graph.add_value("x", {rows, channels});
  const ValueId b = graph.add_value("b", {rows, channels});
  const ValueId sum = graph.add_value("sum", {rows, channels});
  const ValueId normed = graph.add_value("normed", {rows, channels});
  DropoutOp* dropout = nullptr;
  ResidualLayerNormOp* residual_layernorm = nullptr;
  if (fused) {
    const ParamId w = params.add("ln.weight", {channels}, ParamInit::kOnes, 0.0f, false);
    const ParamId bias = params.add("ln.bias", {channels}, ParamInit::kZeros, 0.0f, false);
    residual_layernorm = &graph.add_op<ResidualLayerNormOp>("fused", {x, b}, {sum, normed},
                                                            {w, bias}, rows, channels, p, salt, 16);
  } else {
    dropout = &graph.add_op<DropoutOp>("dropout", {b}, {sum}, {}, rows * channels, p, salt);
  }
  add_weighted_sum_loss(graph, sum, 9);
  params.allocate(device);
  params.initialize(3);
  Executor executor(graph, params);
  Workspace ws = executor.make_workspace();
  ws.dropout_seed = 0xfeedull;
  executor.forward(ws);
  return fused ? residual_layernorm->keep_mask() : dropout->keep_mask();
}

TEST(CudaGptOps, DropoutMasksEqualTheCpuMasksBitForBit) {
  FT_SKIP_WITHOUT_GPU();
  const int64_t rows = 37, channels = 129;
  for (const float p : {0.1f, 0.5f}) {
    const std::vector<uint8_t> cpu = forward_mask(Device::kCpu, false, rows, channels, p, 77);
    ASSERT_EQ(cpu.size(), static_cast<size_t>(rows * channels));
    EXPECT_TRUE(forward_mask(test::kGpu, false, rows, channels, p, 77) == cpu) << "DropoutOp";
    EXPECT_TRUE(forward_mask(test::kGpu, true, rows, channels, p, 77) == cpu)
        << "ResidualLayerNormOp";
    EXPECT_FALSE(forward_mask(test::kGpu, false, rows, channels, p, 78) == cpu)
        << "another salt should draw another mask";
  }
}

// ---- fused residual LayerNorm ------------------------------------------------------------------

// residual_in x and branch b -> sum = x + dropout(b), normed = LN(sum); next_residual = sum +
// normed reads both outputs. With `later_readers`, x and b are read again after the fused op, so
// its input gradients accumulate instead of being written fresh. `branch_view`: b is a column
// view of a wider buffer (fused only: DropoutOp and ResidualAddOp take no views, so neither the
// unfused chain nor the later readers can read it).
struct ResidualChain {
  int64_t rows, channels;
  float p;
  bool later_readers, branch_view;
};

GraphBuilder residual_chain_graph(const ResidualChain& c, bool fused) {
  FT_CHECK(!c.branch_view || (fused && !c.later_readers),
           "a branch view is read only by the fused op");
  return [=](Graph& graph, ParamStore& params) {
    const int64_t rows = c.rows, C = c.channels;
    const ValueId x = graph.add_value("residual_in", {rows, C});
    ValueId b = -1;
    if (c.branch_view) {
      const ValueId wide = graph.add_value("wide", {rows, 2 * C});
      b = graph.add_view("branch", wide, C, C);
    } else {
      b = graph.add_value("branch", {rows, C});
    }
    const ParamId w = params.add("ln.weight", {C}, ParamInit::kOnes, 0.0f, false);
    const ParamId bias = params.add("ln.bias", {C}, ParamInit::kZeros, 0.0f, false);
    const ValueId sum = graph.add_value("sum", {rows, C});
    const ValueId normed = graph.add_value("normed", {rows, C});
    if (fused) {
      graph.add_op<ResidualLayerNormOp>("fused", {x, b}, {sum, normed}, {w, bias}, rows, C, c.p,
                                        uint64_t{0x5a17}, 16);
    } else {
      ValueId dropped = b;
      if (c.p > 0.0f) {
        dropped = graph.add_value("dropped", {rows, C});
        graph.add_op<DropoutOp>("dropout", {b}, {dropped}, {}, rows * C, c.p, uint64_t{0x5a17});
      }
      graph.add_op<ResidualAddOp>("residual", {x, dropped}, {sum}, {}, rows * C);
      graph.add_op<LayerNormOp>("ln", {sum}, {normed}, {w, bias}, rows, C);
    }
    ValueId y = graph.add_value("next_residual", {rows, C});
    graph.add_op<ResidualAddOp>("next_residual", {sum, normed}, {y}, {}, rows * C);
    if (c.later_readers) {
      const ValueId again = graph.add_value("again", {rows, C});
      graph.add_op<ResidualAddOp>("again", {y, x}, {again}, {}, rows * C);
      y = graph.add_value("again2", {rows, C});
      graph.add_op<ResidualAddOp>("again2", {again, b}, {y}, {}, rows * C);
    }
    add_weighted_sum_loss(graph, y, 10);
  };
}

const std::vector<ResidualChain>& residual_chains() {
  static const std::vector<ResidualChain> chains = {
      {37, 129, 0.0f, false, false}, {37, 129, 0.1f, false, false}, {16, 768, 0.1f, true, false},
      {16, 768, 0.0f, true, false},  {21, 64, 0.3f, false, true},   {300, 40, 0.1f, true, false},
      {300, 40, 0.0f, false, true}};
  return chains;
}

std::string describe(const ResidualChain& c) {
  return "rows " + std::to_string(c.rows) + " C " + std::to_string(c.channels) + " p " +
         std::to_string(c.p) + (c.later_readers ? " accumulating" : " fresh") +
         (c.branch_view ? " branch view" : "");
}

TEST(CudaGptOps, ResidualLayerNormMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  for (const ResidualChain& chain : residual_chains()) {
    SCOPED_TRACE(describe(chain));
    expect_devices_agree(residual_chain_graph(chain, true), kNormRtol, kNormAtol);
  }
}

TEST(CudaGptOps, ResidualLayerNormMatchesItsUnfusedChainOnCuda) {
  FT_SKIP_WITHOUT_GPU();
  for (const ResidualChain& chain : residual_chains()) {
    if (chain.branch_view) continue;
    SCOPED_TRACE(describe(chain));
    const DeviceRun fused = run_on(test::kGpu, residual_chain_graph(chain, true), {});
    const DeviceRun unfused = run_on(test::kGpu, residual_chain_graph(chain, false), {});
    // residual_in, branch, sum, normed, next_residual, the loss value. sum's gradient buffer
    // holds only what its later readers sent in the fused graph (the op adds LN' itself), and
    // that plus LN' in the unfused one, where the LayerNorm reads sum as a graph value.
    expect_shared_values_close(fused, unfused, kNormRtol, kNormAtol, 6, {"sum"});
  }
}

// ---- batched LayerNorm
// ---------------------------------------------------------------------------

// `count` per-head LayerNorms over the column views of one [rows, count * head] buffer into the
// columns of another; even heads share (wq, bq), odd ones (wk, bk), as qk_norm's heads do.
GraphBuilder batched_graph(int64_t rows, int64_t head, int count, bool fused) {
  return [=](Graph& graph, ParamStore& params) {
    const ValueId in = graph.add_value("heads_in", {rows, count * head});
    const ValueId out = graph.add_value("heads_out", {rows, count * head});
    const ParamId wq = params.add("q_norm.weight", {head}, ParamInit::kOnes, 0.0f, false);
    const ParamId bq = params.add("q_norm.bias", {head}, ParamInit::kZeros, 0.0f, false);
    const ParamId wk = params.add("k_norm.weight", {head}, ParamInit::kOnes, 0.0f, false);
    const ParamId bk = params.add("k_norm.bias", {head}, ParamInit::kZeros, 0.0f, false);
    std::vector<ValueId> xs, ys;
    std::vector<ParamId> pairs;
    for (int n = 0; n < count; ++n) {
      xs.push_back(graph.add_view("x" + std::to_string(n), in, n * head, head));
      ys.push_back(graph.add_view("y" + std::to_string(n), out, n * head, head));
      pairs.push_back(n % 2 == 0 ? wq : wk);
      pairs.push_back(n % 2 == 0 ? bq : bk);
    }
    if (fused) {
      graph.add_op<BatchedLayerNormOp>("batched", xs, ys, pairs, rows, head, count);
    } else {
      for (int n = 0; n < count; ++n)
        graph.add_op<LayerNormOp>("ln" + std::to_string(n), {xs[n]}, {ys[n]},
                                  {pairs[2 * n], pairs[2 * n + 1]}, rows, head);
    }
    add_weighted_sum_loss(graph, out, 11);
  };
}

struct BatchedShape {
  int64_t rows, head;
  int count;
};

// count 40 takes two launches of the 32-LayerNorm kernel table.
const std::vector<BatchedShape> kBatchedShapes = {{33, 32, 4}, {300, 64, 6}, {9, 16, 40}};

TEST(CudaGptOps, BatchedLayerNormMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  for (const BatchedShape& s : kBatchedShapes) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " head " + std::to_string(s.head) + " count " +
                 std::to_string(s.count));
    expect_devices_agree(batched_graph(s.rows, s.head, s.count, true), kNormRtol, kNormAtol);
  }
}

TEST(CudaGptOps, BatchedLayerNormMatchesUnfusedLayerNormsOnCuda) {
  FT_SKIP_WITHOUT_GPU();
  for (const BatchedShape& s : kBatchedShapes) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " head " + std::to_string(s.head) + " count " +
                 std::to_string(s.count));
    const DeviceRun fused = run_on(test::kGpu, batched_graph(s.rows, s.head, s.count, true), {});
    const DeviceRun unfused = run_on(test::kGpu, batched_graph(s.rows, s.head, s.count, false), {});
    // Same kernels and order on both sides: per-row math is identical, and the shared parameters
    // are summed last LayerNorm first by the fused op as by the unfused chain's backward.
    expect_shared_values_close(fused, unfused, kExact, kExactAtol, 3);
  }
}

}  // namespace
}  // namespace ft

// Tests for model/gpt.h: the parameter table (names, shapes, init, weight decay), qk_norm
// parameters, a whole-model finite-difference gradient check with and without qk_norm, the tied
// wte gradient, and train/eval graphs sharing one ParamStore.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/check.h"
#include "core/rng.h"
#include "model/executor.h"
#include "model/gpt.h"
#include "model/gradcheck.h"

namespace ft {
namespace {

GptShape small_shape(bool qk_norm, float dropout = 0.0f) {
  GptShape shape;
  shape.n_layer = 2;
  shape.n_head = 2;
  shape.d_model = 16;
  shape.seq_len = 8;
  shape.vocab_size = 32;
  shape.dropout = dropout;
  shape.qk_norm = qk_norm;
  return shape;
}

void fill_batch(Workspace& ws, int rows, int vocab, uint64_t seed) {
  Rng rng(seed);
  ws.tokens.resize(rows);
  ws.targets.resize(rows);
  for (int i = 0; i < rows; ++i) {
    ws.tokens[i] = static_cast<int32_t>(rng.below(vocab));
    ws.targets[i] = static_cast<int32_t>(rng.below(vocab));
  }
}

// Replaces the init with larger random values (and non-trivial norm weights and biases), so every
// parameter carries a gradient well above the finite-difference noise floor.
void randomize(ParamStore& params, uint64_t seed) {
  Rng rng(seed);
  for (ParamId id = 0; id < params.size(); ++id) {
    Param& param = params[id];
    const bool norm_weight = param.init == ParamInit::kOnes;
    const float mean = norm_weight ? 1.0f : 0.0f;
    const float std = param.shape.size() >= 2 ? 0.3f : 0.2f;
    for (int64_t i = 0; i < param.value.numel(); ++i)
      param.value.data()[i] = mean + std * rng.normal();
  }
}

TEST(GptParamsTest, NamesShapesAndInitMatchTheTable) {
  const GptShape shape = small_shape(false);
  ParamStore params;
  build_gpt(shape, 2, params);
  struct Row {
    std::string name;
    Shape shape;
  };
  std::vector<Row> expected = {{"wte.weight", {32, 16}}, {"wpe.weight", {8, 16}}};
  for (int i = 0; i < 2; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    const std::vector<Row> block = {{h + "ln_1.weight", {16}},
                                    {h + "ln_1.bias", {16}},
                                    {h + "attn.c_attn.weight", {48, 16}},
                                    {h + "attn.c_attn.bias", {48}},
                                    {h + "attn.c_proj.weight", {16, 16}},
                                    {h + "attn.c_proj.bias", {16}},
                                    {h + "ln_2.weight", {16}},
                                    {h + "ln_2.bias", {16}},
                                    {h + "mlp.c_fc.weight", {64, 16}},
                                    {h + "mlp.c_fc.bias", {64}},
                                    {h + "mlp.c_proj.weight", {16, 64}},
                                    {h + "mlp.c_proj.bias", {16}}};
    expected.insert(expected.end(), block.begin(), block.end());
  }
  expected.push_back({"ln_f.weight", {16}});
  expected.push_back({"ln_f.bias", {16}});
  ASSERT_EQ(params.size(), static_cast<int>(expected.size()));
  const float proj_std = 0.02f / std::sqrt(4.0f);
  for (ParamId id = 0; id < params.size(); ++id) {
    const Param& param = params[id];
    EXPECT_EQ(param.name, expected[id].name);
    EXPECT_EQ(param.shape, expected[id].shape) << param.name;
    EXPECT_EQ(param.weight_decay, param.shape.size() >= 2) << param.name;
    const bool is_proj = param.name.find("c_proj.weight") != std::string::npos;
    const bool is_norm_weight = param.name.find("ln_") != std::string::npos &&
                                param.name.find(".weight") != std::string::npos;
    if (param.shape.size() >= 2) {
      EXPECT_EQ(param.init, ParamInit::kNormal) << param.name;
      EXPECT_FLOAT_EQ(param.init_std, is_proj ? proj_std : 0.02f) << param.name;
    } else {
      EXPECT_EQ(param.init, is_norm_weight ? ParamInit::kOnes : ParamInit::kZeros) << param.name;
    }
  }
}

TEST(GptParamsTest, QkNormAddsHeadDimNormsAfterCAttn) {
  ParamStore params;
  build_gpt(small_shape(true), 2, params);
  for (int i = 0; i < 2; ++i) {
    const std::string h = "h." + std::to_string(i) + ".attn.";
    const ParamId c_attn_bias = params.find(h + "c_attn.bias");
    const char* names[4] = {"q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias"};
    for (int j = 0; j < 4; ++j) {
      const ParamId id = params.find(h + names[j]);
      ASSERT_EQ(id, c_attn_bias + 1 + j) << h + names[j];
      EXPECT_EQ(params[id].shape, Shape{8});
      EXPECT_FALSE(params[id].weight_decay);
      EXPECT_EQ(params[id].init, j % 2 == 0 ? ParamInit::kOnes : ParamInit::kZeros);
    }
  }
  ParamStore plain;
  build_gpt(small_shape(false), 2, plain);
  EXPECT_EQ(plain.find("h.0.attn.q_norm.weight"), -1);
  EXPECT_EQ(params.size(), plain.size() + 8);
}

TEST(GptParamsTest, RejectsBadShapes) {
  GptShape shape = small_shape(false);
  shape.n_head = 3;  // 16 % 3 != 0
  ParamStore params;
  EXPECT_THROW(build_gpt(shape, 2, params), Error);
  shape = small_shape(false);
  shape.dropout = 1.0f;
  EXPECT_THROW(build_gpt(shape, 2, params), Error);
  shape = small_shape(false);
  EXPECT_THROW(build_gpt(shape, 0, params), Error);
}

// Whole-model check on the mean cross-entropy (|L| ~ 3.5; gradients down to ~1e-3 matter).
// Round-off: one ulp of the loss is ~4e-7, so the five-point stencil's numeric derivative carries
// ~1.5 * 4e-7 / (2 eps) absolute noise (measured 1.6e-5 at eps = 2e-2 on entries whose exact
// gradient is 0, such as the key biases, which softmax ignores). Truncation: the randomised
// model is strongly curved; at eps = 2e-2 it measured up to 0.6% (wte), growing as eps^4.
// eps = 2e-2 balances the two; floor = 3e-3 caps the noise at ~0.5% relative. The worst entry
// measured 0.6% over 800 samples, so 2e-2 leaves a 3x margin; a backward bug gives O(1) errors.
void check_model_gradients(bool qk_norm, float dropout) {
  const GptShape shape = small_shape(qk_norm, dropout);
  ParamStore params;
  Graph graph = build_gpt(shape, 2, params);
  params.allocate();
  randomize(params, 3);
  Executor executor(graph, params);
  Workspace ws = executor.make_workspace();
  fill_batch(ws, 16, shape.vocab_size, 4);
  ws.dropout_seed = 1234;
  GradcheckOptions options;
  options.eps = 2e-2f;
  options.floor = 3e-3f;
  options.samples_per_tensor = 12;
  const GradcheckReport report = gradcheck(graph, params, ws, {}, options);
  std::printf("  gradcheck: max rel error %.2e over %d entries, worst %s\n", report.max_rel_error,
              report.entries_checked, report.worst.c_str());
  EXPECT_LT(report.max_rel_error, 2e-2f) << "worst entry " << report.worst;
  EXPECT_GT(report.max_abs_grad, 1e-2f);
  int64_t expected_entries = 0;  // every parameter tensor is sampled
  for (ParamId id = 0; id < params.size(); ++id)
    expected_entries += std::min<int64_t>(12, params[id].value.numel());
  EXPECT_EQ(report.entries_checked, expected_entries);
}

TEST(GptModelTest, GradientsMatchFiniteDifferences) {
  check_model_gradients(false, 0.0f);
}
TEST(GptModelTest, GradientsMatchFiniteDifferencesWithQkNormAndDropout) {
  check_model_gradients(true, 0.1f);
}

TEST(GptModelTest, LossAtInitIsNearUniform) {
  const GptShape shape = small_shape(false);
  ParamStore params;
  Graph graph = build_gpt(shape, 2, params);
  params.allocate();
  params.initialize(7);
  Executor executor(graph, params);
  Workspace ws = executor.make_workspace();
  fill_batch(ws, 16, shape.vocab_size, 8);
  executor.forward(ws);
  EXPECT_NEAR(executor.loss(ws), std::log(32.0f), 0.05f);
  EXPECT_EQ(ws.values[graph.output].shape(), (Shape{16, 32}));
}

// The embedding and the LM head both read wte; the executor's backward must leave the sum of
// their two contributions in wte's gradient.
TEST(GptModelTest, TiedWteGradientIsTheSumOfBothUses) {
  const GptShape shape = small_shape(false);
  ParamStore params;
  Graph graph = build_gpt(shape, 2, params);
  params.allocate();
  randomize(params, 9);
  Executor executor(graph, params);
  Workspace ws = executor.make_workspace();
  fill_batch(ws, 16, shape.vocab_size, 10);
  const ParamId wte = params.find("wte.weight");
  executor.forward(ws);
  params.zero_grads();
  executor.backward(ws);
  const std::vector<float> total(params[wte].grad.data(),
                                 params[wte].grad.data() + params[wte].grad.numel());
  // Rerun each user's backward alone on the activation gradients the full backward left behind.
  Op* users[2] = {nullptr, nullptr};
  for (auto& op : graph.ops)
    if (std::string(op->kind()) == "embedding")
      users[0] = op.get();
    else if (std::string(op->kind()) == "lm_head")
      users[1] = op.get();
  ASSERT_TRUE(users[0] && users[1]);
  std::vector<float> parts[2];
  for (int u = 0; u < 2; ++u) {
    params.zero_grads();
    users[u]->backward(ws, params);
    parts[u].assign(params[wte].grad.data(), params[wte].grad.data() + params[wte].grad.numel());
  }
  double norms[2] = {0, 0};
  for (size_t i = 0; i < total.size(); ++i) {
    EXPECT_NEAR(total[i], parts[0][i] + parts[1][i], 1e-6) << i;
    norms[0] += std::fabs(parts[0][i]);
    norms[1] += std::fabs(parts[1][i]);
  }
  EXPECT_GT(norms[0], 1e-3);  // both uses contribute
  EXPECT_GT(norms[1], 1e-3);
  // wte is final only after the embedding's backward, the last op run: reported last.
  EXPECT_EQ(executor.grad_ready_order().back(), params.find("wpe.weight"));
  const auto& order = executor.grad_ready_order();
  EXPECT_EQ(order[order.size() - 2], wte);
}

// The trainer registers once and builds a train and an eval graph over the same parameters;
// rows of a batch are independent, so the eval graph's logits for sequence 0 match the train
// graph's (evaluated with dropout off).
TEST(GptModelTest, GraphsOfDifferentBatchSizesShareParameters) {
  const GptShape shape = small_shape(true, 0.2f);
  ParamStore params;
  const GptParamIds ids = register_gpt_params(shape, params);
  Graph train = build_gpt_graph(shape, 3, ids, GraphMode::kEval);
  Graph eval = build_gpt_graph(shape, 1, ids, GraphMode::kEval);
  Graph dropout_train = build_gpt_graph(shape, 3, ids, GraphMode::kTrain);
  params.allocate();
  randomize(params, 11);
  Executor train_executor(train, params), eval_executor(eval, params);
  Executor dropout_executor(dropout_train, params);
  Workspace train_ws = train_executor.make_workspace(), eval_ws = eval_executor.make_workspace();
  Workspace dropout_ws = dropout_executor.make_workspace();
  fill_batch(train_ws, 24, shape.vocab_size, 12);
  dropout_ws.tokens = train_ws.tokens;
  dropout_ws.targets = train_ws.targets;
  eval_ws.tokens.assign(train_ws.tokens.begin(), train_ws.tokens.begin() + 8);
  eval_ws.targets.assign(train_ws.targets.begin(), train_ws.targets.begin() + 8);
  train_executor.forward(train_ws);
  eval_executor.forward(eval_ws);
  const float* train_logits = train_ws.values[train.output].data();  // re-pointed below
  const float* eval_logits = eval_ws.values[eval.output].data();
  for (int i = 0; i < 8 * shape.vocab_size; ++i) EXPECT_NEAR(eval_logits[i], train_logits[i], 1e-5);
  // With dropout on, training logits differ from the evaluation ones.
  dropout_ws.dropout_seed = 5;
  dropout_executor.forward(dropout_ws);
  train_logits = dropout_ws.values[dropout_train.output].data();
  float difference = 0.0f;
  for (int i = 0; i < 8 * shape.vocab_size; ++i)
    difference = std::max(difference, std::fabs(eval_logits[i] - train_logits[i]));
  EXPECT_GT(difference, 1e-3f);
}

}  // namespace
}  // namespace ft

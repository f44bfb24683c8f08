// train.precision: bf16 on the whole GPT: the eager bf16 graph (with its cast ops) against every
// fusion pass in bf16, bf16 against fp32, the fused weight-copy sweep against its unfused twin
// (bit for bit), the graph check that keeps bf16 values away from fp32-only ops, checkpoints
// moving fp32 -> bf16 -> fp32, and 300 training steps of gpt_tiny tracking fp32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "app/training/trainer.h"
#include "core/rng.h"
#include "fusion/pipeline.h"
#include "model/executor.h"
#include "model/gpt.h"
#include "model/graph_edit.h"
#include "model/ops/gelu.h"
#include "tests/precision_test_util.h"

namespace ft {
namespace {

using namespace precision_test;

// The batch: random tokens and targets, and a fixed dropout seed.
void fill_tokens(const Graph& graph, Workspace& ws) {
  Rng rng(4);
  const int rows = static_cast<int>(graph.numel(graph.output) / 256);
  for (int i = 0; i < rows; ++i) {
    ws.tokens.push_back(static_cast<int32_t>(rng.next_u64() % 256));
    ws.targets.push_back(static_cast<int32_t>(rng.next_u64() % 256));
  }
  ws.dropout_seed = 77;
}

StepResult run_step(Graph graph, ParamStore& params, const FusionOptions& options) {
  return precision_test::run_step(std::move(graph), params, options, fill_tokens);
}

class Bf16Gpt : public ::testing::Test {
 protected:
  void SetUp() override {
    ids_ = register_gpt_params(shape_, params_);
    params_.enable_bf16_copies();
    params_.allocate();
    params_.initialize(9);
  }
  Graph build(DType dtype) const {
    return build_gpt_graph(shape_, 3, ids_, GraphMode::kTrain, dtype);
  }

  GptShape shape_{2, 2, 32, 16, 256, 0.1f, true};
  ParamStore params_;
  GptParamIds ids_;
};

// Without qk_norm q, k and v go straight from the QKV GEMM's views to their casts, which the cast
// pass hands to the GEMM as one bf16 output.
class Bf16GptNoQkNorm : public Bf16Gpt {
 protected:
  Bf16GptNoQkNorm() { shape_.qk_norm = false; }
};

// bf16 rounding of the cast values makes a 1e-7 fp32 difference between a fused kernel and its
// eager twin flip the last bf16 bit of a few elements (2^-8 relative), which is what these
// tolerances allow; a wrong weight copy, transpose or bias is off by orders more.
TEST_F(Bf16Gpt, FusedMatchesEagerInBf16) {
  FusionOptions off;
  off.enabled = false;
  const StepResult eager = run_step(build(DType::kBF16), params_, off);
  // Per block: ln_1, q, k, the probabilities, v, the attention output, ln_2 and the GELU output;
  // then ln_f.
  EXPECT_EQ(eager.casts, 2 * 8 + 1);
  const StepResult fused = run_step(build(DType::kBF16), params_, FusionOptions());
  EXPECT_NEAR(fused.loss, eager.loss, 1e-3f * eager.loss);
  EXPECT_LT(relative_error(eager.logits, fused.logits), 1e-2f);
  EXPECT_LT(relative_error(eager.grads, fused.grads), 2e-2f);
}

// fusion.vertical.cast: every producer that absorbs its cast rounds the same fp32 values once,
// so the rewritten graph matches its twin (the casts as separate ops) bit for bit. Flash
// attention's output is the exception (FlashAttentionWritingBf16TracksItsTwin), so "all" runs
// here with the eager attention chain, whose mix keeps its cast.
TEST_F(Bf16Gpt, CastPassMatchesItsTwinBitForBit) {
  FusionOptions all_but_attention;
  all_but_attention.vertical.attention = false;
  FusionOptions all_but_cast = all_but_attention;
  all_but_cast.vertical.cast = false;
  FusionOptions only_cast;
  only_cast.vertical = {false, false, false, false, false, true};
  only_cast.horizontal.qkv = only_cast.horizontal.batched_layernorm = false;
  FusionOptions off;
  off.enabled = false;
  const struct {
    const char* name;
    FusionOptions twin, fused;
    int twin_casts;
    // What stays: the casts of q, k, v (written through views) and the attention output (the
    // mix writes fp32), and in eager the probabilities' (the causal softmax writes fp32).
    int casts_left;
  } cases[] = {{"all", all_but_cast, all_but_attention, 2 * 8 + 1, 2 * 5},
               {"eager", off, only_cast, 2 * 8 + 1, 2 * 5}};
  for (const auto& c : cases) {
    const StepResult twin = run_step(build(DType::kBF16), params_, c.twin);
    const StepResult fused = run_step(build(DType::kBF16), params_, c.fused);
    EXPECT_EQ(twin.casts, c.twin_casts) << c.name;
    EXPECT_EQ(fused.casts, c.casts_left) << c.name;
    expect_same_bits(fused, twin, c.name);
  }
}

// Flash attention writing its output in bf16 against its twin, flash attention writing fp32 and
// the cast: forward rounds the same Y / l once, so the loss and logits agree bit for bit; backward
// takes D = <dY, Y> on the rounded Y where the twin has the fp32 one, a difference within bf16
// rounding of D (2^-9 relative), which the gradients see through dS = P (dP - D): 5.5e-4 of the
// largest gradient here (Zen 4, both paths), which 5e-3 bounds; a wrong rounding is off by more.
TEST_F(Bf16Gpt, FlashAttentionWritingBf16TracksItsTwin) {
  FusionOptions all_but_cast;
  all_but_cast.vertical.cast = false;
  const StepResult twin = run_step(build(DType::kBF16), params_, all_but_cast);
  const StepResult fused = run_step(build(DType::kBF16), params_, FusionOptions());
  EXPECT_EQ(twin.casts, 2 * 7 + 1);  // flash attention took the probabilities' cast
  EXPECT_EQ(fused.casts, 2 * 3) << "q, k and v keep theirs (column views)";
  EXPECT_EQ(fused.loss, twin.loss);
  EXPECT_EQ(fused.logits, twin.logits);
  EXPECT_NE(fused.grads, twin.grads) << "D on the rounded Y should move some gradient bits";
  EXPECT_LT(relative_error(twin.grads, fused.grads), 5e-3f);
}

// Casts do not count against fusion.max_ops (counted_ops): at max_ops 3 flash attention (3
// compute ops) fuses in bf16 as in fp32, with the probabilities' cast inside and its output's
// absorbed; at max_ops 2 it does not fuse (the probabilities and the mix keep their casts); at 1
// nothing fuses, casts included.
TEST_F(Bf16Gpt, CastsDoNotCountAgainstMaxOps) {
  const struct {
    int max_ops;
    int flash_ops, casts;
  } cases[] = {{3, 2, 2 * 3}, {2, 0, 2 * 5}, {1, 0, 2 * 8 + 1}};
  for (const auto& c : cases) {
    FusionOptions options;
    options.max_ops = c.max_ops;
    const StepResult fused = run_step(build(DType::kBF16), params_, options);
    EXPECT_EQ(std::count(fused.kinds.begin(), fused.kinds.end(), "flash_attention"), c.flash_ops)
        << "max_ops " << c.max_ops;
    EXPECT_EQ(fused.casts, c.casts) << "max_ops " << c.max_ops;
  }
}

// The pass explains itself: what each absorbed cast saved, and why a cast stayed.
TEST_F(Bf16Gpt, CastPassRecordsItsDecisions) {
  Graph graph = build(DType::kBF16);
  const FusionResult result = FusionPipeline::standard().run(graph, params_, FusionOptions());
  int fused = 0, kept = 0, kept_after_attention = 0;
  for (const FusionDecision& decision : result.decisions) {
    if (decision.pass != "cast") continue;
    if (decision.fused) {
      ++fused;
      EXPECT_NE(decision.reason.find("writes bf16"), std::string::npos) << decision.reason;
    } else {
      ++kept;
      // q and k are written through column views (qk_norm's per-head LayerNorms); v's cast would
      // make the QKV GEMM's output bf16, which q and k read in fp32.
      const bool view = decision.reason.find("column view") != std::string::npos ||
                        decision.reason.find("a root has one dtype") != std::string::npos;
      const bool fp32_producer = decision.reason.find("writes fp32 only") != std::string::npos;
      EXPECT_TRUE(view || fp32_producer) << decision.reason;
      kept_after_attention += decision.site.find("attn.mix") != std::string::npos;
    }
  }
  EXPECT_EQ(fused, 2 * 4 + 1);  // ln_1, the attention output, ln_2, the GELU output; ln_f
  EXPECT_EQ(kept, 2 * 3);       // q, k, v (the QKV GEMM's outputs)
  EXPECT_EQ(kept_after_attention, 0) << "flash attention writes its output in bf16";
}

// The QKV GEMM writing bf16 q, k, v in row tiles against its twin, the fp32 GEMM and three cast
// ops: the same fp32 sums rounded once, so bit for bit, read by the eager attention chain. With
// flash attention (which widens the strided views on the widening path) forward stays bit for
// bit; its own bf16 output moves the gradients within bf16 rounding
// (FlashAttentionWritingBf16TracksItsTwin).
TEST_F(Bf16GptNoQkNorm, QkvGemmWritingBf16MatchesItsCastsBitForBit) {
  for (int tile_kb : {1024, 4}) {  // one tile, and tiles of 1 row (a 3C row is 384 bytes)
    for (bool flash : {false, true}) {
      FusionOptions all;
      all.tile_kb = tile_kb;
      all.vertical.attention = flash;
      FusionOptions all_but_cast = all;  // tile_kb also sets Linear+GELU's tiles, on both sides
      all_but_cast.vertical.cast = false;
      const StepResult twin = run_step(build(DType::kBF16), params_, all_but_cast);
      const StepResult fused = run_step(build(DType::kBF16), params_, all);
      // Per block the twin keeps ln_1, q, k, v, the attention output, ln_2 and the GELU output
      // (and the probabilities' without flash attention); the eager mix keeps its cast.
      EXPECT_EQ(twin.casts, 2 * (flash ? 7 : 8) + 1);
      EXPECT_EQ(fused.casts, flash ? 0 : 2 * 2) << "eager: the probabilities and the mix";
      const std::string name = "qkv, tile_kb " + std::to_string(tile_kb) + (flash ? ", flash" : "");
      if (!flash) {
        expect_same_bits(fused, twin, name.c_str());
        continue;
      }
      EXPECT_EQ(fused.loss, twin.loss) << name;
      EXPECT_EQ(fused.logits, twin.logits) << name;
      EXPECT_LT(relative_error(twin.grads, fused.grads), 1e-2f) << name;
    }
  }
}

TEST_F(Bf16GptNoQkNorm, CastPassRecordsTheQkvGroup) {
  Graph graph = build(DType::kBF16);
  const FusionResult result = FusionPipeline::standard().run(graph, params_, FusionOptions());
  int groups = 0;
  for (const FusionDecision& decision : result.decisions)
    if (decision.pass == "cast" && decision.fused &&
        decision.reason.find("qkv_linear+3 casts") != std::string::npos) {
      ++groups;
      EXPECT_EQ(decision.ops_absorbed, 6) << "3 Linears and 3 casts";
    }
  EXPECT_EQ(groups, 2);
}

TEST_F(Bf16Gpt, Bf16TracksFp32) {
  FusionOptions off;
  off.enabled = false;
  const StepResult fp32 = run_step(build(DType::kF32), params_, off);
  const StepResult bf16 = run_step(build(DType::kBF16), params_, off);
  EXPECT_EQ(fp32.casts, 0);
  EXPECT_NEAR(bf16.loss, fp32.loss, 5e-3f * fp32.loss);
  EXPECT_LT(relative_error(fp32.logits, bf16.logits), 3e-2f);
  EXPECT_LT(relative_error(fp32.grads, bf16.grads), 5e-2f);
  // ...but not equal: the bf16 GEMMs really ran on rounded operands.
  EXPECT_GT(relative_error(fp32.grads, bf16.grads), 1e-5f);
}

// The copies a forward reads are cast again after any change of the masters.
TEST_F(Bf16Gpt, StaleWeightCopiesAreRefreshedBeforeForward) {
  FusionOptions off;
  off.enabled = false;
  run_step(build(DType::kBF16), params_, off);
  Tensor& values = params_.flat_values();
  for (int64_t i = 0; i < values.numel(); ++i) values.data()[i] *= 0.5f;
  params_.mark_changed();
  EXPECT_TRUE(params_.bf16_copies_stale());
  run_step(build(DType::kBF16), params_, off);
  EXPECT_FALSE(params_.bf16_copies_stale());
  for (int64_t i = 0; i < values.numel(); ++i)
    ASSERT_EQ(params_.flat_bf16_values().bf16_data()[i], float_to_bf16(values.data()[i])) << i;
}

TEST(Bf16Graph, ValidateRefusesABf16ValueIntoAnFp32OnlyOp) {
  Graph graph;
  const ValueId x = graph.add_value("x", {4, 8}, DType::kBF16);
  const ValueId y = graph.add_value("y", {4, 8});
  graph.input = x;
  graph.add_op<GeluOp>("gelu", {x}, {y}, {}, 32);
  graph.output = graph.loss = y;
  try {
    validate(graph);
    FAIL() << "validate accepted a bf16 input to gelu";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("reads the bf16 value 'x'"), std::string::npos)
        << error.what();
  }
}

Config gpt_config(const std::string& precision, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> overrides = {"data.path=" + source_path("data/moby_dick.txt"),
                                        "train.threads=1",
                                        "model.n_layer=2",
                                        "model.d_model=32",
                                        "model.n_head=2",
                                        "train.batch_size=4",
                                        "train.precision=" + precision};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return load_config(source_path("configs/gpt_tiny.yaml"), overrides);
}

// The multi-tensor optimizer writes the bf16 copies in its update sweep; its twin (per-tensor
// update, then one cast sweep before the next forward) must give the same bits every step.
TEST(Bf16Optimizer, FusedWeightCopyMatchesTheSeparateCastSweep) {
  for (const std::string optimizer : {"adamw", "sgd"}) {
    const std::string name = "optim.name=" + optimizer;
    Trainer fused(gpt_config("bf16", {"fusion.horizontal.multi_tensor=true", name}), nullptr);
    Trainer twin(gpt_config("bf16", {"fusion.horizontal.multi_tensor=false", name}), nullptr);
    for (int step = 0; step < 5; ++step) {
      const float expected = twin.train_step().loss;
      EXPECT_EQ(fused.train_step().loss, expected) << optimizer << " step " << step + 1;
      // Straight after the step: the fused sweep has written the copies, the twin has not yet.
      EXPECT_FALSE(fused.params().bf16_copies_stale());
      EXPECT_TRUE(twin.params().bf16_copies_stale());
      twin.params().refresh_bf16_copies();
      const Tensor& a = fused.params().flat_bf16_values();
      const Tensor& b = twin.params().flat_bf16_values();
      ASSERT_EQ(a.numel(), b.numel());
      for (int64_t i = 0; i < a.numel(); ++i)
        ASSERT_EQ(a.bf16_data()[i], b.bf16_data()[i])
            << optimizer << " step " << step + 1 << " element " << i;
    }
  }
}

// Checkpoints hold the fp32 masters only: a run moves fp32 -> bf16 -> fp32 with its parameters
// bit for bit, and each reader evaluates them in its own precision.
TEST(Bf16Checkpoint, MovesFp32ToBf16ToFp32) {
  const std::string dir = ::testing::TempDir() + "/ft_precision_ckpt";
  std::filesystem::create_directories(dir);
  Trainer fp32(gpt_config("fp32"), nullptr);
  for (int step = 0; step < 3; ++step) fp32.train_step();
  fp32.save_checkpoint(dir + "/a.safetensors");
  const double fp32_loss = fp32.evaluate(2).loss;

  Trainer bf16(gpt_config("bf16"), nullptr);
  bf16.load_checkpoint(dir + "/a.safetensors");
  EXPECT_NEAR(bf16.evaluate(2).loss, fp32_loss, 1e-2 * fp32_loss);
  for (int step = 0; step < 3; ++step) bf16.train_step();
  EXPECT_EQ(bf16.step(), 6);
  bf16.save_checkpoint(dir + "/b.safetensors");

  Trainer back(gpt_config("fp32"), nullptr);
  back.load_checkpoint(dir + "/b.safetensors");
  EXPECT_EQ(back.step(), 6);
  const std::vector<float> written = bf16.params().flat_values().to_host_vector();
  const std::vector<float> read = back.params().flat_values().to_host_vector();
  ASSERT_EQ(written.size(), read.size());
  for (size_t i = 0; i < written.size(); ++i) ASSERT_EQ(written[i], read[i]) << i;
  EXPECT_TRUE(std::isfinite(back.train_step().loss));
}

// gpt_tiny as configured (300 steps): bf16's final loss within 2% of fp32's.
TEST(Bf16Training, GptTinyThreeHundredStepsTrackFp32) {
  const std::vector<std::string> preset = {"data.path=" + source_path("data/moby_dick.txt"),
                                           "train.threads=1", "train.eval_every=0"};
  auto final_loss = [&](const std::string& precision) {
    std::vector<std::string> overrides = preset;
    overrides.push_back("train.precision=" + precision);
    Trainer trainer(load_config(source_path("configs/gpt_tiny.yaml"), overrides), nullptr);
    double tail = 0;  // the mean of the last 20 steps: one batch's loss is noisy
    const int steps = trainer.config().train.steps;
    for (int step = 0; step < steps; ++step) {
      const float loss = trainer.train_step().loss;
      if (step >= steps - 20) tail += loss / 20.0;
    }
    return tail;
  };
  const double fp32 = final_loss("fp32");
  const double bf16 = final_loss("bf16");
  EXPECT_NEAR(bf16, fp32, 0.02 * fp32);
}

}  // namespace
}  // namespace ft

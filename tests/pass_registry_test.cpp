// The pass registry (fusion/pass_registry.h): a pass defined here and added to the standard
// pipeline with one line shows up everywhere pass keys are listed (plan's decisions, bench's
// ablation keys, fusion advice's key tables, the config schema's rows) once that pipeline's
// registry is handed to them, the registry's keys are the schema's fusion.* switches, and a pass
// that creates op kinds it does not declare fails at that pass. Order, duplicate and drift
// checks: tests/pass_order_test.cpp.
#include "fusion/pass_registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "app/analysis/bench.h"
#include "app/analysis/fusion_advice.h"
#include "app/analysis/plan.h"
#include "app/analysis/tune.h"
#include "app/config/config.h"
#include "app/config/config_schema.h"
#include "app/training/task.h"
#include "core/check.h"
#include "fusion/passes.h"
#include "fusion/pipeline.h"
#include "tests/config_test_util.h"
#include "tests/pass_registry_test_util.h"

namespace ft {
namespace {

using config_test::error_of;
using pass_registry_test::g_toy_on;

// A vertical pass that only looks: one skipped decision for the graph, no rewrite.
class ToyPass : public FusionPass {
 public:
  const PassInfo& info() const override {
    static const PassInfo info{"toy",
                               PassFamily::kVertical,
                               +[](FusionOptions&) { return &g_toy_on; },
                               "a toy pass of tests/pass_registry_test.cpp",
                               {},
                               {"cast"},
                               {{OpKind::kGelu, OpKind::kLinear}},
                               {}};
    return info;
  }
  int apply(Graph& graph, PassContext& context) const override {
    context.skipped("toy", graph.ops.back()->name, "the toy only looks");
    return 0;
  }
};

// gemm_epilogue's rewrite under a PassInfo that declares no fused op kinds.
class MislabelledPass : public FusionPass {
 public:
  const PassInfo& info() const override {
    static const PassInfo info{"mislabelled",
                               PassFamily::kVertical,
                               +[](FusionOptions&) { return &g_toy_on; },
                               "",
                               {},
                               {},
                               {},
                               {}};
    return info;
  }
  int apply(Graph& graph, PassContext& context) const override {
    return inner_->apply(graph, context);
  }

 private:
  std::unique_ptr<FusionPass> inner_ = make_gemm_epilogue_pass();
};

FusionPipeline with_toy() {
  FusionPipeline pipeline = FusionPipeline::standard();
  pipeline.add(std::make_unique<ToyPass>());  // the one line that registers a pass
  return pipeline;
}

Config tiny_gpt_config(const std::vector<std::string>& overrides = {}) {
  const std::string yaml =
      "model:\n  arch: gpt\n  n_layer: 1\n  n_head: 2\n  d_model: 16\n  seq_len: 8\n"
      "train:\n  batch_size: 2\n  threads: 1\n"
      "data:\n  path: " +
      std::string(FT_SOURCE_DIR) + "/data/moby_dick.txt\n";
  return parse_config(yaml, "tiny_gpt.yaml", overrides);
}

TEST(PassRegistry, ToyPassAppearsInPlanDecisions) {
  const Config config = tiny_gpt_config();
  std::unique_ptr<Task> task = make_task(config, 0, 1);
  ParamStore params;
  task->register_params(params);
  params.allocate();
  auto build = [&] { return task->build_graph(config.train.batch_size, GraphMode::kTrain); };
  const Plan plan = build_plan(build, params, config.fusion, with_toy());
  ASSERT_FALSE(plan.fusion.passes.empty());
  EXPECT_EQ(plan.fusion.passes.back().pass, "toy");
  EXPECT_TRUE(plan.fusion.passes.back().enabled);
  const bool decided = std::any_of(
      plan.fusion.decisions.begin(), plan.fusion.decisions.end(),
      [](const FusionDecision& d) { return d.pass == "toy" && d.reason == "the toy only looks"; });
  EXPECT_TRUE(decided);
  const Plan standard = build_plan(build, params, config.fusion);
  for (const FusionDecision& decision : standard.fusion.decisions) EXPECT_NE(decision.pass, "toy");
}

TEST(PassRegistry, ToyPassKeyIsAnAblationKey) {
  const FusionPipeline toy = with_toy();
  const std::vector<std::string> keys = bench_ablation_keys(toy.registry());
  std::vector<std::string> expected = bench_ablation_keys();
  // Vertical keys come first, in list order: the toy is the last vertical one.
  const auto first_horizontal =
      std::find_if(expected.begin(), expected.end(),
                   [](const std::string& key) { return key.rfind("fusion.horizontal.", 0) == 0; });
  expected.insert(first_horizontal, "fusion.vertical.toy");
  EXPECT_EQ(keys, expected);
  // bench --ablation runs it as all-toy; the standard registry has no such variant.
  const std::vector<BenchVariant> variants = expand_bench_variants("all", true, toy.registry());
  const auto all_toy = std::find_if(variants.begin(), variants.end(),
                                    [](const BenchVariant& v) { return v.name == "all-toy"; });
  ASSERT_NE(all_toy, variants.end());
  EXPECT_EQ(all_toy->overrides.back(), "fusion.vertical.toy=false");
  EXPECT_NE(error_of([] { expand_bench_variants("all-toy", false); }), "");
  EXPECT_EQ(tune_fusion_overrides({}, toy.registry()).size(), keys.size() + 1);
}

TEST(PassRegistry, ToyPassIsInTheAdviceKeyTable) {
  const FusionPipeline toy = with_toy();
  const PassInfo* pass = vertical_advice_pass(toy.registry(), OpKind::kGelu, OpKind::kLinear);
  ASSERT_NE(pass, nullptr);
  EXPECT_EQ(pass->key(), "fusion.vertical.toy");
  EXPECT_EQ(vertical_advice_pass(PassRegistry::standard(), OpKind::kGelu, OpKind::kLinear),
            nullptr);
  // The standard passes' edges and families, as the advice tables held them.
  EXPECT_EQ(vertical_advice_pass(toy.registry(), OpKind::kLinear, OpKind::kGelu)->key(),
            "fusion.vertical.gemm_epilogue");
  EXPECT_EQ(horizontal_advice_pass(toy.registry(), OpKind::kConv2d, 2, true)->key(),
            "fusion.horizontal.conv_shortcut");
  EXPECT_EQ(horizontal_advice_pass(toy.registry(), OpKind::kConv2d, 3, true), nullptr);
  EXPECT_EQ(horizontal_advice_pass(toy.registry(), OpKind::kLinear, 3, false), nullptr);
}

TEST(PassRegistry, ToyPassKeyIsASchemaRowThatSetsItsSwitch) {
  const FusionPipeline toy_pipeline = with_toy();
  const std::vector<config_schema::Field> fields =
      config_schema::pass_fields(toy_pipeline.registry(), PassFamily::kVertical);
  const auto toy = std::find_if(fields.begin(), fields.end(), [](const config_schema::Field& f) {
    return f.key == "fusion.vertical.toy";
  });
  ASSERT_NE(toy, fields.end());
  EXPECT_EQ(toy->doc, "a toy pass of tests/pass_registry_test.cpp");
  EXPECT_EQ(config_schema::type_name(*toy), "bool");
  Config config;
  EXPECT_EQ(config_schema::assign_value(*toy, config, "false", false), "");
  EXPECT_FALSE(g_toy_on);
  EXPECT_EQ(config_schema::format_value(*toy, config), "false");
  EXPECT_NE(config_schema::assign_value(*toy, config, "maybe", false), "");
  g_toy_on = true;
  // In the whole table, the toy's row follows the last standard vertical switch.
  const std::vector<config_schema::Field> table =
      config_schema::build_fields(toy_pipeline.registry());
  const auto row = std::find_if(table.begin(), table.end(), [](const config_schema::Field& f) {
    return f.key == "fusion.vertical.toy";
  });
  ASSERT_NE(row, table.end());
  EXPECT_EQ(row->doc, "a toy pass of tests/pass_registry_test.cpp");
  EXPECT_EQ((row - 1)->key, "fusion.vertical.cast");
  EXPECT_EQ(table.size(), config_schema::fields().size() + 1);
  EXPECT_EQ(config_schema::find_field("fusion.vertical.toy"), nullptr);
}

// Every key of the registry is a bool row of the schema with the pass's doc, and every
// fusion.vertical.* and fusion.horizontal.* switch of the schema is a registry key.
TEST(PassRegistry, RegistryKeysAreTheSchemaSwitches) {
  const PassRegistry& registry = PassRegistry::standard();
  for (const PassInfo* pass : registry.entries()) {
    const config_schema::Field* field = config_schema::find_field(pass->key());
    ASSERT_NE(field, nullptr) << pass->key();
    EXPECT_EQ(field->doc, pass->doc) << pass->key();
    Config config;
    EXPECT_EQ(config_schema::format_value(*field, config),
              pass->on(config.fusion) ? "true" : "false");
    EXPECT_EQ(config_schema::assign_value(*field, config, "false", false), "") << pass->key();
    EXPECT_FALSE(pass->on(config.fusion)) << pass->key();
  }
  for (const config_schema::Field& field : config_schema::fields()) {
    const bool is_switch = (field.key.rfind("fusion.vertical.", 0) == 0 ||
                            field.key.rfind("fusion.horizontal.", 0) == 0) &&
                           config_schema::type_name(field) == "bool";
    if (!is_switch) continue;
    EXPECT_NE(registry.find_key(field.key), nullptr) << field.key;
  }
  EXPECT_NE(registry.find_key("inference.fold_bn"), nullptr);
  EXPECT_NE(registry.find_key("fusion.horizontal.multi_tensor"), nullptr);
  EXPECT_EQ(registry.find_key("fusion.cuda_graph"), nullptr);  // not a pass
  EXPECT_EQ(FusionPipeline::standard().size(), 10u);           // graph passes; one switch more
  EXPECT_EQ(registry.entries().size(), 11u);
}

TEST(PassRegistry, StandardOrderHoldsItsConstraints) {
  EXPECT_NO_THROW(FusionPipeline::standard());
  // A pass that must run after cast may follow the standard list.
  EXPECT_NO_THROW(with_toy());
}

TEST(PassRegistry, UndeclaredFusedOpKindFailsAtThePass) {
  const Config config = tiny_gpt_config();
  std::unique_ptr<Task> task = make_task(config, 0, 1);
  ParamStore params;
  task->register_params(params);
  params.allocate();
  Graph graph = task->build_graph(config.train.batch_size, GraphMode::kTrain);
  FusionPipeline pipeline;
  pipeline.add(std::make_unique<MislabelledPass>());
  const std::string error = error_of([&] { pipeline.run(graph, params, config.fusion); });
  EXPECT_NE(error.find("fusion pass 'mislabelled' created a linear_gelu op"), std::string::npos)
      << error;
}

// The standard list runs attention after classifier, so that the registry lists the vertical keys
// in their config order; attention touches no op the passes between take, so the executed graph
// is the one the earlier order (attention right after conv_shortcut) made.
TEST(PassRegistry, AttentionAfterClassifierMakesTheSameGraph) {
  FusionPipeline earlier;
  for (auto make :
       {make_fold_bn_pass, make_qkv_pass, make_batched_layernorm_pass, make_conv_shortcut_pass,
        make_attention_pass, make_gemm_epilogue_pass, make_residual_layernorm_pass,
        make_classifier_pass, make_bn_relu_pass, make_cast_pass})
    earlier.add(make());
  for (const char* precision : {"fp32", "bf16"})
    for (GraphMode mode : {GraphMode::kTrain, GraphMode::kEval}) {
      const Config config = tiny_gpt_config(
          {std::string("train.precision=") + precision, "model.qk_norm=true", "model.dropout=0.1"});
      std::unique_ptr<Task> task = make_task(config, 0, 1);
      ParamStore params;
      task->register_params(params);
      params.allocate();
      Graph standard = task->build_graph(config.train.batch_size, mode);
      Graph reference = task->build_graph(config.train.batch_size, mode);
      FusionPipeline::standard().run(standard, params, config.fusion);
      earlier.run(reference, params, config.fusion);
      ASSERT_EQ(standard.ops.size(), reference.ops.size()) << precision;
      for (size_t i = 0; i < standard.ops.size(); ++i) {
        const Op& a = *standard.ops[i];
        const Op& b = *reference.ops[i];
        EXPECT_EQ(a.name, b.name) << precision << " op " << i;
        EXPECT_EQ(a.op_kind(), b.op_kind()) << a.name;
        EXPECT_EQ(a.inputs, b.inputs) << a.name;
        EXPECT_EQ(a.outputs, b.outputs) << a.name;
        EXPECT_EQ(a.params, b.params) << a.name;
        EXPECT_EQ(a.eager_ops, b.eager_ops) << a.name;
      }
      ASSERT_EQ(standard.values.size(), reference.values.size()) << precision;
      for (size_t v = 0; v < standard.values.size(); ++v) {
        EXPECT_EQ(standard.values[v].name, reference.values[v].name);
        EXPECT_EQ(standard.values[v].dtype, reference.values[v].dtype);
        EXPECT_EQ(standard.values[v].needs_grad, reference.values[v].needs_grad);
      }
    }
}

}  // namespace
}  // namespace ft

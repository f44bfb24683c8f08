// The per-op profiler (app/analysis/profiler.h) and the fusion advice drawn from it
// (app/analysis/fusion_advice.h): on a tiny GPT, a profiled run's op rows plus "outside ops" add up
// to the step time measured here; every op of the executed graph appears with one call per
// micro-batch of each measured step; the advice on the eager graph recommends gemm_epilogue for
// linear -> gelu and reports the key's state, and on the fused graph it names no enabled pass.
// Hand-built graphs pin the two rules' thresholds.
#include "app/analysis/profiler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "app/analysis/fusion_advice.h"
#include "app/training/trainer.h"
#include "core/timer.h"

namespace ft {
namespace {

std::string source_path(const std::string& relative) {
  return std::string(FT_SOURCE_DIR) + "/" + relative;
}

// The tiny GPT of tests/fusion_model_test.cpp, at batch 16 so that each c_fc output
// ([1024, 128] floats, 512 KiB) is above the vertical rule's 256 KiB.
Config gpt_config(bool fused, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> overrides = {
      "data.path=" + source_path("data/moby_dick.txt"),
      "train.threads=1",
      "model.n_layer=2",
      "model.d_model=32",
      "model.n_head=2",
      "model.dropout=0.1",
      "model.qk_norm=true",
      "train.steps=8",
      "optim.warmup_steps=2",
      "train.batch_size=16",
      std::string("fusion.enabled=") + (fused ? "true" : "false")};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return load_config(source_path("configs/gpt_tiny.yaml"), overrides);
}

struct ProfiledRun {
  std::unique_ptr<Trainer> trainer;
  std::unique_ptr<Profiler> profiler;
  double measured_step_ms = 0;  // wall time around train_step() of the profiled steps, from here
  double reported_step_ms = 0;  // StepStats::step_ms of the same steps
};

ProfiledRun run_profiled(const Config& config) {
  ProfiledRun run;
  run.trainer = std::make_unique<Trainer>(config, nullptr);
  run.profiler = std::make_unique<Profiler>(run.trainer->executor().graph(), kProfileWarmupSteps);
  run.trainer->executor().set_observer(run.profiler.get());
  for (int step = 0; step < config.train.steps; ++step) {
    run.profiler->begin_step();
    const double start = now_ms();
    const StepStats stats = run.trainer->train_step();
    const double wall = now_ms() - start;
    run.profiler->end_step(stats.step_ms);
    if (step >= kProfileWarmupSteps) {
      run.measured_step_ms += wall;
      run.reported_step_ms += stats.step_ms;
    }
  }
  run.trainer->executor().set_observer(nullptr);
  return run;
}

const FusionAdvice* find_advice(const std::vector<FusionAdvice>& advice, const std::string& key) {
  for (const FusionAdvice& item : advice)
    if (item.pass_key == key) return &item;
  return nullptr;
}

TEST(Profiler, SharesSumToTheMeasuredStep) {
  const ProfiledRun run = run_profiled(gpt_config(true));
  const Profile& profile = run.profiler->profile();
  ASSERT_EQ(profile.steps, 8 - kProfileWarmupSteps);
  EXPECT_DOUBLE_EQ(profile.step_ms, run.reported_step_ms);
  // Ops run inside the step, one at a time: their time cannot exceed it.
  EXPECT_GE(profile.outside_ms(), 0.0);
  // The shares as the JSON carries them, op rows plus "outside ops", against this test's clock.
  const nlohmann::json json = profile_json(profile);
  double shares = json["outside_ops"]["share"].get<double>();
  for (const nlohmann::json& op : json["ops"])
    shares += op["forward"]["share"].get<double>() + op["backward"]["share"].get<double>();
  EXPECT_NEAR(shares * profile.step_ms, run.measured_step_ms, 0.05 * run.measured_step_ms);
  EXPECT_NEAR(json["forward_share"].get<double>() + json["backward_share"].get<double>() +
                  json["outside_ops"]["share"].get<double>(),
              1.0, 1e-9);
}

TEST(Profiler, EveryOpOfTheGraphAppearsOncePerMicroBatch) {
  const Config config = gpt_config(true, {"train.grad_accum=2"});
  const ProfiledRun run = run_profiled(config);
  const Profile& profile = run.profiler->profile();
  const Graph& graph = run.trainer->executor().graph();
  ASSERT_EQ(profile.ops.size(), graph.ops.size());
  const int64_t calls = static_cast<int64_t>(profile.steps) * config.train.grad_accum;
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    const ProfileOp& row = profile.ops[i];
    EXPECT_EQ(row.name, graph.ops[i]->name);
    EXPECT_EQ(row.kind, graph.ops[i]->op_kind()) << row.name;
    EXPECT_EQ(row.forward.count, calls) << row.name;
    EXPECT_EQ(row.backward.count, calls) << row.name;
  }
  const nlohmann::json json = profile_json(profile);
  EXPECT_EQ(json["ops"].size(), graph.ops.size());
  const std::string text = format_profile(profile, 1000);
  for (const auto& op : graph.ops) EXPECT_NE(text.find(op->name), std::string::npos) << op->name;
}

TEST(FusionAdvice, UnfusedGraphGetsGemmEpilogueAndItsState) {
  const ProfiledRun run = run_profiled(gpt_config(false));
  const Graph& graph = run.trainer->executor().graph();
  AdviceOptions options;
  options.dispatch_ms = measure_dispatch_ms();
  const std::vector<FusionAdvice> advice =
      advise_fusion(graph, run.profiler->profile(), run.trainer->config().fusion, options);
  const FusionAdvice* gemm = find_advice(advice, "fusion.vertical.gemm_epilogue");
  ASSERT_NE(gemm, nullptr) << format_advice(advice, options);
  EXPECT_EQ(gemm->direction, FusionDirection::kVertical);
  EXPECT_EQ(gemm->pattern.rfind("linear -> gelu", 0), 0u) << gemm->pattern;
  EXPECT_EQ(gemm->sites.size(), 2u);  // one c_fc per layer
  EXPECT_TRUE(gemm->key_on);
  EXPECT_TRUE(gemm->default_on);
  EXPECT_FALSE(gemm->fusion_enabled);
  EXPECT_FALSE(gemm->pass_on());
  EXPECT_GT(gemm->ms_per_step, 0.0);
  const std::string text = describe_advice(*gemm);
  EXPECT_NE(text.find("is on in this config (on by default), but fusion.enabled is false"),
            std::string::npos)
      << text;
  // The attention intermediates ([16, 2, 64, 64], 512 KiB) have one reader each.
  EXPECT_NE(find_advice(advice, "fusion.vertical.attention"), nullptr);
}

TEST(FusionAdvice, HorizontalFamiliesOnlyWhenDispatchDominates) {
  const ProfiledRun run = run_profiled(gpt_config(false));
  const Graph& graph = run.trainer->executor().graph();
  const Profile& profile = run.profiler->profile();
  const FusionOptions& fusion = run.trainer->config().fusion;
  AdviceOptions free_dispatch;
  free_dispatch.dispatch_ms = 0;
  for (const FusionAdvice& item : advise_fusion(graph, profile, fusion, free_dispatch))
    EXPECT_NE(item.direction, FusionDirection::kHorizontal) << describe_advice(item);
  // Dispatch far above any op's time: every independent family qualifies.
  AdviceOptions costly_dispatch;
  costly_dispatch.dispatch_ms = 1e3;
  const std::vector<FusionAdvice> advice = advise_fusion(graph, profile, fusion, costly_dispatch);
  const FusionAdvice* qkv = find_advice(advice, "fusion.horizontal.qkv");
  ASSERT_NE(qkv, nullptr) << format_advice(advice, costly_dispatch);
  EXPECT_EQ(qkv->pattern.rfind("3 x linear", 0), 0u) << qkv->pattern;
  EXPECT_EQ(qkv->sites.size(), 2u);  // q, k, v of each layer
  const FusionAdvice* norms = find_advice(advice, "fusion.horizontal.batched_layernorm");
  ASSERT_NE(norms, nullptr) << format_advice(advice, costly_dispatch);
  EXPECT_GT(norms->dispatch_share, costly_dispatch.min_dispatch_share);
}

TEST(FusionAdvice, FusedGraphNamesNoEnabledPass) {
  const ProfiledRun run = run_profiled(gpt_config(true));
  const Graph& graph = run.trainer->executor().graph();
  const FusionOptions& fusion = run.trainer->config().fusion;
  for (double dispatch_ms : {measure_dispatch_ms(), 1e3}) {
    AdviceOptions options;
    options.dispatch_ms = dispatch_ms;
    const std::vector<FusionAdvice> advice =
        advise_fusion(graph, run.profiler->profile(), fusion, options);
    for (const FusionAdvice& item : advice) EXPECT_FALSE(item.pass_on()) << describe_advice(item);
    EXPECT_EQ(find_advice(advice, "fusion.vertical.gemm_epilogue"), nullptr);
  }
}

// An op of a chosen kind that does nothing: the rules read only kinds, shapes and the profile.
class KindOp : public Op {
 public:
  explicit KindOp(OpKind kind) : kind_(kind) {}
  OpKind op_kind() const override { return kind_; }
  void forward(Workspace&, ParamStore&) override {}
  void backward(Workspace&, ParamStore&) override {}

 private:
  OpKind kind_;
};

// An op that reports a choice it made by timing, as Conv2dOp does under conv_algorithm: measure.
class ChoosingOp : public KindOp {
 public:
  ChoosingOp() : KindOp(OpKind::kConv2d) {}
  std::string runtime_choice() const override { return "forward a 1.0 ms <= b 2.0 ms"; }
};

TEST(Profiler, ShowsWhatOpsChoseByMeasuring) {
  Graph graph;
  graph.input = graph.add_value("x", {4});
  const ValueId y = graph.add_value("y", {4});
  graph.output = graph.loss = graph.add_value("loss", {1});
  graph.add_op<ChoosingOp>("timed_conv", {graph.input}, {y}, {});
  graph.add_op<KindOp>("plain_loss", {y}, {graph.loss}, {}, OpKind::kCrossEntropy);
  Profiler profiler(graph, 0);
  profiler.begin_step();
  for (int op = 0; op < 2; ++op)
    for (const bool backward : {false, true})
      profiler.on_op(*graph.ops[op], op, backward, 0.0, 1.0);
  profiler.end_step(5.0);
  const std::string text = format_profile(profiler.profile());
  const size_t section = text.find("chosen by measurement");
  ASSERT_NE(section, std::string::npos) << text;
  EXPECT_NE(text.find("timed_conv                   forward a 1.0 ms <= b 2.0 ms", section),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("plain_loss", section), std::string::npos) << text;
  const nlohmann::json json = profile_json(profiler.profile());
  EXPECT_EQ(json["ops"][0]["runtime_choice"], "forward a 1.0 ms <= b 2.0 ms");
  EXPECT_FALSE(json["ops"][1].contains("runtime_choice"));
}

// x -> linear -> a -> gelu -> b -> relu -> c -> loss, all rows x 64; with `second_reader` the
// relu reads a instead and the loss reads b and c.
Graph linear_gelu_graph(int64_t rows, bool second_reader) {
  Graph graph;
  graph.input = graph.add_value("x", {rows, 64});
  const ValueId a = graph.add_value("a", {rows, 64});
  const ValueId b = graph.add_value("b", {rows, 64});
  const ValueId c = graph.add_value("c", {rows, 64});
  graph.output = graph.loss = graph.add_value("loss", {1});
  graph.add_op<KindOp>("fc", {graph.input}, {a}, {}, OpKind::kLinear);
  graph.add_op<KindOp>("act", {a}, {b}, {}, OpKind::kGelu);
  graph.add_op<KindOp>("other", {second_reader ? a : b}, {c}, {}, OpKind::kRelu);
  graph.add_op<KindOp>("loss", second_reader ? std::vector<ValueId>{b, c} : std::vector<ValueId>{c},
                       {graph.loss}, {}, OpKind::kCrossEntropy);
  return graph;
}

Profile empty_profile(const Graph& graph) {
  return Profiler(graph, 0).profile();
}

TEST(FusionAdvice, VerticalRuleNeedsOneLargeConsumer) {
  const FusionOptions fusion;
  const AdviceOptions options;  // 256 KiB
  const auto advice_for = [&](int64_t rows, bool second_reader) {
    const Graph graph = linear_gelu_graph(rows, second_reader);
    return advise_fusion(graph, empty_profile(graph), fusion, options);
  };
  // 1025 x 64 floats is just over 256 KiB, 1024 x 64 exactly 256 KiB.
  const std::vector<FusionAdvice> advice = advice_for(1025, false);
  const FusionAdvice* gemm = find_advice(advice, "fusion.vertical.gemm_epilogue");
  ASSERT_NE(gemm, nullptr);
  EXPECT_TRUE(gemm->pass_on());
  EXPECT_EQ(gemm->sites, std::vector<std::string>{"fc -> act"});
  EXPECT_EQ(find_advice(advice_for(1024, false), "fusion.vertical.gemm_epilogue"), nullptr);
  EXPECT_EQ(find_advice(advice_for(1025, true), "fusion.vertical.gemm_epilogue"), nullptr);
  // gelu -> relu: large, one reader, no pass for it.
  const auto uncovered = std::find_if(advice.begin(), advice.end(), [](const FusionAdvice& item) {
    return item.pattern.rfind("gelu -> relu", 0) == 0;
  });
  ASSERT_NE(uncovered, advice.end());
  EXPECT_TRUE(uncovered->pass_key.empty());
  EXPECT_NE(describe_advice(*uncovered).find("no pass covers it"), std::string::npos);
}

}  // namespace
}  // namespace ft

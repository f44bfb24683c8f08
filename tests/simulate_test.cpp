// The cluster simulator (app/analysis/simulate.h) against figures worked out by hand: a four-op
// backward with two buckets (three per-parameter buckets with bucketing off), every bucketing ×
// overlap mode, the ring formula's factors, and the link parser's errors.
#include "app/analysis/simulate.h"

#include <gtest/gtest.h>

#include "app/config/config.h"
#include "app/training/trainer.h"
#include "comm/emulated_link.h"
#include "core/check.h"

namespace ft {
namespace {

constexpr double kTol = 1e-9;

// α = 100 µs, β = 1 GB/s = 1e6 bytes/ms, so at 2 ranks t(bytes) = 0.2 ms + bytes / 1e6 ms.
LinkModel toy_link() {
  return parse_link("100,1");
}

// Backward runs op 3, 2, 1, 0 for 1, 2, 3 and 0.5 ms: they end at 1, 3, 6 and 6.5 ms.
SimStep toy_step() {
  SimStep step;
  step.before_backward_ms = 5;
  step.backward_op_ms = {0.5, 3, 2, 1};
  step.after_backward_ms = 2;
  return step;  // single rank: 5 + 6.5 + 2 = 13.5 ms
}

// Bucketing off: p1 (3 MB, final after op 3), p2 (1 MB, after op 2), p3 (1 MB, after op 0).
std::vector<SimBucket> toy_buckets_off() {
  return {{3000000, 3}, {1000000, 2}, {1000000, 0}};
}
// Bucketing on: {p1, p2} (4 MB, after op 2) and {p3}.
std::vector<SimBucket> toy_buckets_on() {
  return {{4000000, 2}, {1000000, 0}};
}

TEST(SimulateTest, RingFormulaFactors) {
  const LinkModel link = toy_link();
  EXPECT_EQ(ring_allreduce_ms(link, 1000000, 1), 0.0);
  EXPECT_EQ(ring_allreduce_ms(link, 0, 1), 0.0);
  EXPECT_NEAR(ring_allreduce_ms(link, 1000000, 2), 0.2 + 1.0, kTol);
  // 2(n-1) = 6 latency steps, 2(n-1)/n = 1.5 times the payload.
  EXPECT_NEAR(ring_allreduce_ms(link, 1000000, 4), 0.6 + 1.5, kTol);
}

TEST(SimulateTest, OneRankHasNoCommunication) {
  const SimPrediction p = simulate_step(toy_step(), toy_buckets_on(), false, toy_link(), 1);
  EXPECT_EQ(p.exposed_ms, 0.0);
  EXPECT_NEAR(p.iteration_ms, 13.5, kTol);
  EXPECT_NEAR(p.efficiency, 1.0, kTol);
}

TEST(SimulateTest, BucketingOffOverlapOff) {
  // All three after backward: 3.2 + 1.2 + 1.2 ms.
  const SimPrediction p = simulate_step(toy_step(), toy_buckets_off(), false, toy_link(), 2);
  EXPECT_EQ(p.allreduces, 3);
  EXPECT_NEAR(p.comm_ms, 5.6, kTol);
  EXPECT_NEAR(p.exposed_ms, 5.6, kTol);
  EXPECT_NEAR(p.iteration_ms, 19.1, kTol);
  EXPECT_NEAR(p.efficiency, 13.5 / 19.1, kTol);
}

TEST(SimulateTest, BucketingOffOverlapOn) {
  // p1 runs 1 → 4.2, p2 (ready at 3) waits for it: 4.2 → 5.4, p3 6.5 → 7.7: 1.2 ms exposed.
  const SimPrediction p = simulate_step(toy_step(), toy_buckets_off(), true, toy_link(), 2);
  EXPECT_NEAR(p.comm_ms, 5.6, kTol);
  EXPECT_NEAR(p.exposed_ms, 1.2, kTol);
  EXPECT_NEAR(p.iteration_ms, 14.7, kTol);
}

TEST(SimulateTest, BucketingOnOverlapOff) {
  // 4.2 + 1.2 ms after backward.
  const SimPrediction p = simulate_step(toy_step(), toy_buckets_on(), false, toy_link(), 2);
  EXPECT_EQ(p.allreduces, 2);
  EXPECT_EQ(p.bytes, 5000000);
  EXPECT_NEAR(p.exposed_ms, 5.4, kTol);
  EXPECT_NEAR(p.iteration_ms, 18.9, kTol);
}

TEST(SimulateTest, BucketingOnOverlapOn) {
  // The first bucket runs 3 → 7.2, past backward's end at 6.5; the second waits: 7.2 → 8.4.
  const SimPrediction p = simulate_step(toy_step(), toy_buckets_on(), true, toy_link(), 2);
  EXPECT_NEAR(p.comm_ms, 5.4, kTol);
  EXPECT_NEAR(p.exposed_ms, 1.9, kTol);
  EXPECT_NEAR(p.iteration_ms, 15.4, kTol);
  EXPECT_NEAR(p.efficiency, 13.5 / 15.4, kTol);
}

TEST(SimulateTest, ClusterReportCoversEveryModeAtEveryRankCount) {
  const SimReport report =
      simulate_cluster(toy_step(), toy_buckets_off(), toy_buckets_on(), toy_link(), {2, 8});
  ASSERT_EQ(report.predictions.size(), 8u);
  EXPECT_EQ(report.buckets_off, 3);
  EXPECT_EQ(report.buckets_on, 2);
  const SimPrediction& p = report.predictions[3];  // 2 ranks, bucketing on, overlap on
  EXPECT_EQ(p.ranks, 2);
  EXPECT_TRUE(p.bucketing);
  EXPECT_TRUE(p.overlap);
  EXPECT_NEAR(p.iteration_ms, 15.4, kTol);
  EXPECT_EQ(report.predictions[4].ranks, 8);
  EXPECT_EQ(sim_report_json(report)["predictions"].size(), 8u);
  EXPECT_NE(sim_report_markdown(report).find("8 ranks"), std::string::npos);
}

TEST(SimulateTest, NamedLinks) {
  const LinkModel ib = parse_link("ib400");
  EXPECT_EQ(ib.name, "ib400");
  EXPECT_EQ(ib.alpha_us, 5.0);
  EXPECT_EQ(ib.beta_gbytes_per_s, 40.0);
  const LinkModel custom = parse_link("50,2.5");
  EXPECT_EQ(custom.name, "custom");
  EXPECT_EQ(custom.alpha_us, 50.0);
  EXPECT_EQ(custom.beta_gbytes_per_s, 2.5);
}

TEST(SimulateTest, BadLinkNamesTheAllowedForms) {
  for (const char* text : {"ib100", "", "5", "5,abc", "x,5", "5,0", "-1,5", "5,5,5"}) {
    try {
      parse_link(text);
      ADD_FAILURE() << "'" << text << "' was accepted";
    } catch (const Error& error) {
      const std::string message = error.what();
      for (const char* allowed : {"nvlink4", "ib400", "eth100", "eth25", "ALPHA_US,GBPS"})
        EXPECT_NE(message.find(allowed), std::string::npos) << text << ": " << message;
    }
  }
}

TEST(SimulateTest, RankList) {
  EXPECT_EQ(parse_rank_list("8,64,512,4096"), (std::vector<int>{8, 64, 512, 4096}));
  EXPECT_THROW(parse_rank_list("8,,64"), Error);
  EXPECT_THROW(parse_rank_list("0"), Error);
  EXPECT_THROW(parse_rank_list("8x"), Error);
}

TEST(SimulateTest, EmulatedEquivalentCostsWhatTheRingPredicts) {
  const LinkModel link = toy_link();
  for (int ranks : {2, 3}) {
    const EmulatedEquivalent equivalent = emulated_equivalent(link, ranks);
    EmulatedLink emulated;
    emulated.latency_us = equivalent.latency_us;
    emulated.bandwidth_gbps = equivalent.bandwidth_gbps;
    for (int64_t bytes : {int64_t{0}, int64_t{4096}, int64_t{3000000}})
      EXPECT_NEAR(emulated.extra_us(bytes) / 1e3, ring_allreduce_ms(link, bytes, ranks), 1e-9)
          << ranks << " ranks, " << bytes << " bytes";
  }
}

// gpt_tiny's real layout: each bucket is ready after the earliest op reading one of its params (and
// no earlier op reads any), the ready ops never rise (buckets launch in backward order), and the
// payloads add up to every trainable gradient.
TEST(SimulateTest, BucketsReadyAfterTheirParamsFirstUser) {
  Trainer trainer(load_config(std::string(FT_SOURCE_DIR) + "/configs/gpt_tiny.yaml"), nullptr);
  const Graph& graph = trainer.executor().graph();
  const ParamStore& params = trainer.params();
  const std::vector<ParamId>& order = trainer.executor().grad_ready_order();
  for (bool bucketing : {false, true}) {
    const std::vector<Bucket> buckets =
        bucketing ? assign_buckets(params, order, 1.0, 0.25) : single_param_buckets(params, order);
    const std::vector<SimBucket> sim = sim_buckets(buckets, graph, params);
    ASSERT_EQ(sim.size(), buckets.size());
    int64_t bytes = 0;
    for (size_t b = 0; b < sim.size(); ++b) {
      bytes += sim[b].bytes;
      if (b > 0) {
        EXPECT_LE(sim[b].ready_after_op, sim[b - 1].ready_after_op) << b;
      }
      auto reads_bucket = [&](int op) {
        for (ParamId id : graph.ops[op]->params)
          for (ParamId mine : buckets[b].params)
            if (id == mine) return true;
        return false;
      };
      EXPECT_TRUE(reads_bucket(sim[b].ready_after_op)) << "bucket " << b;
      for (int op = 0; op < sim[b].ready_after_op; ++op)
        EXPECT_FALSE(reads_bucket(op)) << "bucket " << b << " op " << op;
    }
    EXPECT_EQ(bytes, params.num_trainable_floats() * static_cast<int64_t>(sizeof(float)));
    EXPECT_GT(sim.size(), bucketing ? 1u : 10u);
  }
}

}  // namespace
}  // namespace ft

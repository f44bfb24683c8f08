// The cluster simulator behind `fusiontrain simulate`: predicts one data-parallel iteration at N
// ranks from a step profiled on this machine (per-op backward times, the rest of the step) and the
// model's real gradient buckets with the op whose backward makes each bucket's last gradient final,
// under an α-β model of ring allreduce: t(bytes, n) = 2(n−1)·α + 2(n−1)/n · bytes/β.
// Overlap on: one communication stream serves the buckets in launch order, each bucket starts once
// its last gradient is final in the backward timeline and the bucket before it is done. Overlap
// off: every allreduce runs after backward, back to back. Weak scaling: the per-rank batch is
// fixed, so every rank computes what one rank computes alone and the efficiency is single /
// predicted. Thread safety: pure functions over values.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/buckets.h"
#include "comm/comm_dtype.h"
#include "model/graph.h"

namespace ft {

// β is in GB/s of 1e9 bytes per second, per direction, the rate each ring step sends at.
struct LinkModel {
  std::string name;  // "ib400", or "custom" for ALPHA_US,GBPS
  double alpha_us = 0;
  double beta_gbytes_per_s = 0;
};

// "nvlink4" | "ib400" | "eth100" | "eth25" | "ALPHA_US,GBPS" (GB/s, 1e9 bytes/s; alpha in
// [0, 1e6] us, beta in [0.001, 10000] GB/s, both finite). Throws ft::Error naming the allowed
// forms and ranges on anything else.
LinkModel parse_link(const std::string& text);
// "nvlink4|ib400|eth100|eth25|ALPHA_US,GBPS" with each named link's α and β, for --help.
std::string link_help();

// Ring allreduce of `bytes` over `ranks` ranks in ms; 0 at one rank.
double ring_allreduce_ms(const LinkModel& link, int64_t bytes, int ranks);

// One bucket's allreduce: its payload and the graph op whose backward announces its last gradient.
struct SimBucket {
  int64_t bytes = 0;
  int ready_after_op = 0;  // index into graph.ops; backward runs from the last op down to 0
};

// Each bucket's payload and the earliest graph op (the last in backward) that reads one of its
// params: the Executor announces a param after the backward of its first user in forward order.
// Payloads count `dtype`'s bytes per gradient (comm.grad_dtype).
std::vector<SimBucket> sim_buckets(const std::vector<Bucket>& buckets, const Graph& graph,
                                   const ParamStore& params, CommDtype dtype = CommDtype::kFloat32);

// One measured (or hand-made) step, already divided by the compute scale.
struct SimStep {
  // Compute before the communicating backward: forward, plus the earlier micro-batches' forward
  // and backward under gradient accumulation.
  double before_backward_ms = 0;
  std::vector<double> backward_op_ms;  // the communicating backward, by graph op index
  double after_backward_ms = 0;        // the rest: batch loading, zeroing, clipping, optimizer
  double single_rank_ms() const;       // the whole step without communication
};

struct SimPrediction {
  bool bucketing = false;
  bool overlap = false;
  int ranks = 1;
  int allreduces = 0;
  int64_t bytes = 0;
  double iteration_ms = 0;
  double compute_ms = 0;  // single_rank_ms
  double comm_ms = 0;     // sum of every allreduce's time
  double exposed_ms = 0;  // communication not hidden under backward
  double efficiency = 0;  // single_rank_ms / iteration_ms
};

// REQUIRES: every bucket's ready_after_op indexes step.backward_op_ms; buckets in launch order.
SimPrediction simulate_step(const SimStep& step, const std::vector<SimBucket>& buckets,
                            bool overlap, const LinkModel& link, int ranks);

// The four bucketing × overlap modes at each rank count, rank count major.
struct SimReport {
  LinkModel link;
  double compute_scale = 1;
  SimStep step;
  int buckets_on = 0, buckets_off = 0;  // bucket counts with comm.bucketing true / false
  std::vector<SimPrediction> predictions;
  std::string grad_dtype = "fp32";  // comm.grad_dtype the bucket bytes were counted in
};
SimReport simulate_cluster(const SimStep& step, const std::vector<SimBucket>& buckets_off,
                           const std::vector<SimBucket>& buckets_on, const LinkModel& link,
                           const std::vector<int>& ranks);

// A Markdown table per rank count.
std::string sim_report_markdown(const SimReport& report);
nlohmann::json sim_report_json(const SimReport& report);

// "8,64,512" as rank counts (each in [1, 1000000], no duplicates). Throws ft::Error on anything
// else.
std::vector<int> parse_rank_list(const std::string& text);

// The EmulatedLink settings (α + bytes/β per allreduce, β in Gbit/s) under which one allreduce of
// any size at `ranks` ranks costs what the ring model predicts: α' = 2(n−1)α, β' = β·n / (2(n−1)).
// REQUIRES: ranks >= 2.
struct EmulatedEquivalent {
  double latency_us = 0;
  double bandwidth_gbps = 0;  // Gbit/s, as comm.emulate.bandwidth_gbps
};
EmulatedEquivalent emulated_equivalent(const LinkModel& link, int ranks);

}  // namespace ft

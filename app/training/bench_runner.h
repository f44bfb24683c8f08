// The measuring half of `fusiontrain bench`, shared with `fusiontrain tune`: one Trainer per
// variant config, all from the same seed (same parameters, same batches), `warmup` untimed steps
// each, then `rounds` timed rounds A B C A B C... A Profiler observes every variant's timed
// rounds on rank 0 (ops of that variant's executed graph), and with a trace path every variant's
// first (up to) three timed rounds go into one Chrome trace-event file: one process per
// (variant, rank), pid = variant index x world size + rank, named "<variant> rank <r>".
// On cuda rank 0 also counts each variant's launches (core/launch_counter.h) around each of its
// timed steps, for the table's launches per step.
// Under mpirun every rank must call with the same configs; rank 0's step times are broadcast so
// every rank sees the same results and a caller deciding on them (tune) decides alike.
// Thread safety: one thread per rank.
#pragma once
#include <string>
#include <vector>

#include "app/analysis/bench.h"
#include "app/analysis/fusion_advice.h"
#include "app/analysis/profiler.h"
#include "app/config/config.h"
#include "comm/communicator.h"

namespace ft {

struct BenchRunOptions {
  int warmup = 2;
  int rounds = 10;
  std::string trace_path;       // empty = no trace
  bool progress = true;         // round / ETA lines on stderr (rank 0)
  const char* label = "bench";  // prefix of the progress lines
};

struct BenchRun {
  BenchRunInfo info;
  std::vector<BenchVariantResult> results;        // one per variant, in order
  std::vector<Profile> profiles;                  // rank 0: per variant; elsewhere empty profiles
  std::vector<std::vector<FusionAdvice>> advice;  // rank 0: per variant
  AdviceOptions advice_options;
  int steps_executed = 0;  // training steps this rank ran: variants x (warmup + rounds)
};

// REQUIRES: configs.size() == variants.size() >= 1, rounds >= 1, warmup >= 0.
BenchRun run_bench_variants(const std::vector<Config>& configs,
                            const std::vector<BenchVariant>& variants,
                            const BenchRunOptions& options, Communicator* comm);

// The `top` ops of a profile by forward + backward time, as JSON rows {name, kind, forward_ms,
// backward_ms (both per measured step), share}.
nlohmann::json profile_top_ops_json(const Profile& profile, int top);
// The same as Markdown-free text lines, for stdout after the bench table.
std::string format_top_ops(const std::string& variant, const Profile& profile, int top);

}  // namespace ft

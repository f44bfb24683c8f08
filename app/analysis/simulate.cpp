#include "app/analysis/simulate.h"

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <numeric>
#include <sstream>

#include "core/check.h"

namespace ft {
namespace {

// Assumptions, not measurements: typical per-direction figures for each fabric.
const LinkModel kNamedLinks[] = {
    {"nvlink4", 2.0, 150.0},
    {"ib400", 5.0, 40.0},
    {"eth100", 20.0, 10.0},
    {"eth25", 50.0, 2.5},
};

[[noreturn]] void bad_link(const std::string& text, const std::string& why) {
  FT_USAGE_FAIL("--link '", text, "': ", why, "; expected one of ", link_help());
}

// Bounds of a custom link: α up to a second per message, as comm.emulate.latency_us; β from 1 MB/s
// to 10 TB/s, beyond any fabric (0 or inf would print as a link and predict nothing).
constexpr double kMaxAlphaUs = 1e6, kMinBetaGBps = 1e-3, kMaxBetaGBps = 1e4;

// `field` of --link `all` as a number in [lo, hi]; `what` names it in the error.
double parse_link_number(const std::string& field, const std::string& all, const char* what,
                         double lo, double hi) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(field, &used);
  } catch (const std::exception&) {
    bad_link(all, "'" + field + "' is not a number");
  }
  if (used != field.size()) bad_link(all, "'" + field + "' is not a number");
  if (!(value >= lo && value <= hi)) {
    std::ostringstream range;
    range << std::setprecision(10) << what << " '" << field << "' must be a number in [" << lo
          << ", " << hi << "]";
    bad_link(all, range.str());
  }
  return value;
}

}  // namespace

std::vector<SimBucket> sim_buckets(const std::vector<Bucket>& buckets, const Graph& graph,
                                   const ParamStore& params, CommDtype dtype) {
  std::vector<int> first_user(params.size(), -1);
  for (int op = 0; op < static_cast<int>(graph.ops.size()); ++op)
    for (ParamId id : graph.ops[op]->params)
      if (first_user[id] < 0) first_user[id] = op;
  std::vector<SimBucket> sim;
  for (const Bucket& bucket : buckets) {
    SimBucket& out = sim.emplace_back();
    out.bytes = bucket.count * comm_dtype_bytes(dtype);
    out.ready_after_op = static_cast<int>(graph.ops.size()) - 1;
    for (ParamId id : bucket.params)
      out.ready_after_op = std::min(out.ready_after_op, first_user[id]);
  }
  return sim;
}

std::string link_help() {
  std::ostringstream out;
  for (const LinkModel& link : kNamedLinks)
    out << link.name << " (alpha " << link.alpha_us << " us, beta " << link.beta_gbytes_per_s
        << " GB/s), ";
  out << "or ALPHA_US,GBPS (beta in GB/s = 1e9 bytes/s)";
  return out.str();
}

LinkModel parse_link(const std::string& text) {
  for (const LinkModel& link : kNamedLinks)
    if (text == link.name) return link;
  const size_t comma = text.find(',');
  if (comma == std::string::npos) bad_link(text, "unknown link");
  LinkModel link;
  link.name = "custom";
  link.alpha_us = parse_link_number(text.substr(0, comma), text, "alpha (us)", 0, kMaxAlphaUs);
  link.beta_gbytes_per_s =
      parse_link_number(text.substr(comma + 1), text, "beta (GB/s)", kMinBetaGBps, kMaxBetaGBps);
  return link;
}

double ring_allreduce_ms(const LinkModel& link, int64_t bytes, int ranks) {
  FT_CHECK(ranks >= 1, "rank count must be >= 1, got ", ranks);
  const double steps = 2.0 * (ranks - 1);
  const double alpha_ms = link.alpha_us / 1e3;
  const double bytes_per_ms = link.beta_gbytes_per_s * 1e9 / 1e3;
  return steps * alpha_ms + steps / ranks * static_cast<double>(bytes) / bytes_per_ms;
}

double SimStep::single_rank_ms() const {
  return before_backward_ms + std::accumulate(backward_op_ms.begin(), backward_op_ms.end(), 0.0) +
         after_backward_ms;
}

SimPrediction simulate_step(const SimStep& step, const std::vector<SimBucket>& buckets,
                            bool overlap, const LinkModel& link, int ranks) {
  const int op_count = static_cast<int>(step.backward_op_ms.size());
  // finished_at[i]: ms into backward when op i's backward ends (ops run from the last down).
  std::vector<double> finished_at(op_count, 0.0);
  double clock = 0;
  for (int op = op_count - 1; op >= 0; --op) {
    clock += step.backward_op_ms[op];
    finished_at[op] = clock;
  }
  const double backward_ms = clock;

  SimPrediction prediction;
  prediction.overlap = overlap;
  prediction.ranks = ranks;
  prediction.allreduces = static_cast<int>(buckets.size());
  double stream_free_at = overlap ? 0.0 : backward_ms;
  for (const SimBucket& bucket : buckets) {
    FT_CHECK(bucket.ready_after_op >= 0 && bucket.ready_after_op < op_count,
             "bucket ready after op ", bucket.ready_after_op, " of ", op_count);
    const double ms = ring_allreduce_ms(link, bucket.bytes, ranks);
    const double ready = overlap ? finished_at[bucket.ready_after_op] : backward_ms;
    stream_free_at = std::max(stream_free_at, ready) + ms;
    prediction.comm_ms += ms;
    prediction.bytes += bucket.bytes;
  }
  prediction.exposed_ms = std::max(0.0, stream_free_at - backward_ms);
  prediction.compute_ms = step.single_rank_ms();
  prediction.iteration_ms = prediction.compute_ms + prediction.exposed_ms;
  prediction.efficiency =
      prediction.iteration_ms > 0 ? prediction.compute_ms / prediction.iteration_ms : 1.0;
  return prediction;
}

SimReport simulate_cluster(const SimStep& step, const std::vector<SimBucket>& buckets_off,
                           const std::vector<SimBucket>& buckets_on, const LinkModel& link,
                           const std::vector<int>& ranks) {
  SimReport report;
  report.link = link;
  report.step = step;
  report.buckets_off = static_cast<int>(buckets_off.size());
  report.buckets_on = static_cast<int>(buckets_on.size());
  for (int n : ranks)
    for (bool bucketing : {false, true})
      for (bool overlap : {false, true}) {
        SimPrediction prediction =
            simulate_step(step, bucketing ? buckets_on : buckets_off, overlap, link, n);
        prediction.bucketing = bucketing;
        report.predictions.push_back(prediction);
      }
  return report;
}

std::string sim_report_markdown(const SimReport& report) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof(line),
                "simulate: link %s (alpha %.3g us, beta %.3g GB/s), compute scale %.3g, "
                "single-rank step %.3f ms, %d buckets on / %d off, gradients sent as %s\n",
                report.link.name.c_str(), report.link.alpha_us, report.link.beta_gbytes_per_s,
                report.compute_scale, report.step.single_rank_ms(), report.buckets_on,
                report.buckets_off, report.grad_dtype.c_str());
  out << line;
  int last_ranks = -1;
  for (const SimPrediction& p : report.predictions) {
    if (p.ranks != last_ranks) {
      last_ranks = p.ranks;
      out << "\n" << p.ranks << " ranks\n\n";
      out << "| bucketing | overlap | allreduces | comm ms | exposed ms | iteration ms | "
             "efficiency |\n|---|---|---:|---:|---:|---:|---:|\n";
    }
    std::snprintf(line, sizeof(line), "| %s | %s | %d | %.3f | %.3f | %.3f | %.1f%% |\n",
                  p.bucketing ? "on" : "off", p.overlap ? "on" : "off", p.allreduces, p.comm_ms,
                  p.exposed_ms, p.iteration_ms, 100.0 * p.efficiency);
    out << line;
  }
  return out.str();
}

nlohmann::json sim_report_json(const SimReport& report) {
  nlohmann::json json;
  json["link"] = {{"name", report.link.name},
                  {"alpha_us", report.link.alpha_us},
                  {"beta_gbytes_per_s", report.link.beta_gbytes_per_s}};
  json["compute_scale"] = report.compute_scale;
  json["single_rank_ms"] = report.step.single_rank_ms();
  json["before_backward_ms"] = report.step.before_backward_ms;
  json["backward_ms"] =
      std::accumulate(report.step.backward_op_ms.begin(), report.step.backward_op_ms.end(), 0.0);
  json["after_backward_ms"] = report.step.after_backward_ms;
  json["buckets_on"] = report.buckets_on;
  json["buckets_off"] = report.buckets_off;
  json["grad_dtype"] = report.grad_dtype;
  json["predictions"] = nlohmann::json::array();
  for (const SimPrediction& p : report.predictions)
    json["predictions"].push_back({{"ranks", p.ranks},
                                   {"bucketing", p.bucketing},
                                   {"overlap", p.overlap},
                                   {"allreduces", p.allreduces},
                                   {"bytes", p.bytes},
                                   {"comm_ms", p.comm_ms},
                                   {"exposed_ms", p.exposed_ms},
                                   {"compute_ms", p.compute_ms},
                                   {"iteration_ms", p.iteration_ms},
                                   {"efficiency", p.efficiency}});
  return json;
}

std::vector<int> parse_rank_list(const std::string& text) {
  // A million ranks is beyond any data-parallel job the ring model describes.
  constexpr int kMaxRanks = 1000000;
  std::vector<int> ranks;
  std::stringstream in(text);
  std::string field;
  while (std::getline(in, field, ',')) {
    size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(field, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    FT_USAGE_REQUIRE(used == field.size() && used > 0 && value >= 1 && value <= kMaxRanks,
                     "--ranks '", text, "': expected comma-separated rank counts in [1, ",
                     kMaxRanks, "], such as 8,64,512,4096");
    FT_USAGE_REQUIRE(std::find(ranks.begin(), ranks.end(), value) == ranks.end(), "--ranks '", text,
                     "': ", value, " is given twice; each rank count once");
    ranks.push_back(value);
  }
  FT_USAGE_REQUIRE(!ranks.empty(), "--ranks is empty; expected rank counts such as 8,64,512,4096");
  return ranks;
}

EmulatedEquivalent emulated_equivalent(const LinkModel& link, int ranks) {
  FT_REQUIRE(ranks >= 2, "an emulated link needs at least 2 ranks, got ", ranks);
  const double steps = 2.0 * (ranks - 1);
  EmulatedEquivalent emulated;
  emulated.latency_us = steps * link.alpha_us;
  emulated.bandwidth_gbps = 8.0 * link.beta_gbytes_per_s * ranks / steps;
  return emulated;
}

}  // namespace ft

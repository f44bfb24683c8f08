#include "app/analysis/fusion_advice.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>

#include "core/check.h"
#include "model/graph_edit.h"

namespace ft {
namespace {

void set_pass(FusionAdvice& advice, const PassInfo* pass, const FusionOptions& fusion) {
  if (pass == nullptr) return;
  advice.pass_key = pass->key();
  advice.key_on = pass->on(fusion);
  advice.default_on = pass->on(FusionOptions());
}

std::string shape_text(const Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string shapes_text(const Graph& graph, const std::vector<ValueId>& ids) {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) text += (i ? " " : "") + shape_text(graph.shape(ids[i]));
  return text;
}

double ms_per_step(const Profile& profile, int op_index) {
  return profile.steps > 0 ? profile.ops[op_index].total_ms() / profile.steps : 0.0;
}

ValueId root_of(const Graph& graph, ValueId id) {
  return graph.values[id].is_view() ? graph.values[id].view_of : id;
}

void add_vertical(const Graph& graph, const GraphIndex& index, const Profile& profile,
                  const FusionOptions& fusion, const AdviceOptions& options,
                  const PassRegistry& passes, std::map<std::string, FusionAdvice>& by_pattern) {
  for (size_t producer = 0; producer < graph.ops.size(); ++producer) {
    const Op& op = *graph.ops[producer];
    for (ValueId id : op.outputs) {
      if (index.is_graph_result(id) || index.consumers(id).size() != 1 ||
          index.reader_count_with_views(id) != 1)
        continue;
      const double bytes = static_cast<double>(graph.numel(id)) * sizeof(float);
      if (bytes <= options.min_intermediate_bytes) continue;
      const int consumer = index.consumers(id)[0];
      const Op& next = *graph.ops[consumer];
      const std::string pattern =
          std::string(op.kind()) + " -> " + next.kind() + " " + shape_text(graph.shape(id));
      FusionAdvice& advice = by_pattern[pattern];
      if (advice.sites.empty()) {
        advice.direction = FusionDirection::kVertical;
        advice.pattern = pattern;
        advice.fusion_enabled = fusion.enabled;
        set_pass(advice, vertical_advice_pass(passes, op.op_kind(), next.op_kind()), fusion);
      }
      advice.sites.push_back(op.name + " -> " + next.name);
      advice.ms_per_step +=
          ms_per_step(profile, static_cast<int>(producer)) + ms_per_step(profile, consumer);
      advice.intermediate_bytes = std::max(advice.intermediate_bytes, bytes);
    }
  }
}

// ancestors[i] holds bit j when op i reads, directly or not, a value op j wrote.
std::vector<std::vector<uint64_t>> op_ancestors(const Graph& graph, const GraphIndex& index) {
  const size_t count = graph.ops.size(), words = (count + 63) / 64;
  std::vector<std::vector<uint64_t>> ancestors(count, std::vector<uint64_t>(words, 0));
  for (size_t i = 0; i < count; ++i)
    for (ValueId id : graph.ops[i]->inputs) {
      const int producer = index.producer(root_of(graph, id));
      if (producer < 0) continue;
      for (size_t w = 0; w < words; ++w) ancestors[i][w] |= ancestors[producer][w];
      ancestors[i][producer / 64] |= uint64_t{1} << (producer % 64);
    }
  return ancestors;
}

void add_horizontal(const Graph& graph, const GraphIndex& index, const Profile& profile,
                    const FusionOptions& fusion, const AdviceOptions& options,
                    const PassRegistry& passes, std::map<std::string, FusionAdvice>& by_pattern) {
  if (profile.steps == 0) return;  // the rule weighs measured time
  const auto ancestors = op_ancestors(graph, index);
  const auto depends_on = [&](int later, int earlier) {
    return (ancestors[later][earlier / 64] >> (earlier % 64)) & 1;
  };
  // Ops of one kind and equal value shapes, split first-fit into mutually independent families.
  std::map<std::string, std::vector<std::vector<int>>> families_by_signature;
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    const Op& op = *graph.ops[i];
    const std::string signature = std::string(op.kind()) + " " + shapes_text(graph, op.inputs) +
                                  "->" + shapes_text(graph, op.outputs);
    auto& families = families_by_signature[signature];
    const int op_index = static_cast<int>(i);
    auto fits = [&](const std::vector<int>& family) {
      return std::none_of(family.begin(), family.end(),
                          [&](int member) { return depends_on(op_index, member); });
    };
    auto family = std::find_if(families.begin(), families.end(), fits);
    if (family == families.end())
      families.push_back({op_index});
    else
      family->push_back(op_index);
  }
  for (const auto& [signature, families] : families_by_signature)
    for (const std::vector<int>& family : families) {
      if (family.size() < 2) continue;
      double family_ms = 0, calls = 0;
      bool shares_input = true;
      for (int member : family) {
        const ProfileOp& row = profile.ops[member];
        family_ms += row.total_ms();
        calls += static_cast<double>(row.forward.count + row.backward.count);
        shares_input = shares_input && !graph.ops[member]->inputs.empty() &&
                       graph.ops[member]->inputs[0] == graph.ops[family[0]]->inputs[0];
      }
      family_ms /= profile.steps;
      calls /= profile.steps;
      const double dispatch_share = family_ms > 0 ? options.dispatch_ms * calls / family_ms : 0;
      if (dispatch_share <= options.min_dispatch_share) continue;
      const std::string pattern = std::to_string(family.size()) + " x " + signature;
      FusionAdvice& advice = by_pattern[pattern];
      std::string site;
      for (int member : family) site += (site.empty() ? "" : ", ") + graph.ops[member]->name;
      if (advice.sites.empty()) {
        advice.direction = FusionDirection::kHorizontal;
        advice.pattern = pattern;
        advice.fusion_enabled = fusion.enabled;
        set_pass(advice,
                 horizontal_advice_pass(passes, graph.ops[family[0]]->op_kind(), family.size(),
                                        shares_input),
                 fusion);
      }
      // One share per pattern: the least favourable family's, so the claim holds for all.
      advice.dispatch_share =
          advice.sites.empty() ? dispatch_share : std::min(advice.dispatch_share, dispatch_share);
      advice.sites.push_back(site);
      advice.ms_per_step += family_ms;
    }
}

}  // namespace

const PassInfo* vertical_advice_pass(const PassRegistry& passes, OpKind producer, OpKind consumer) {
  for (const PassInfo* pass : passes.entries())
    for (const FusedEdge& edge : pass->edges)
      if (edge.producer == producer && edge.consumer == consumer) return pass;
  return nullptr;
}

const PassInfo* horizontal_advice_pass(const PassRegistry& passes, OpKind kind, size_t size,
                                       bool shares_input) {
  for (const PassInfo* pass : passes.entries())
    for (const MergedFamily& family : pass->families)
      if (family.kind == kind && (shares_input || !family.shared_input) &&
          (family.size == 0 || family.size == size))
        return pass;
  return nullptr;
}

std::vector<FusionAdvice> advise_fusion(const Graph& graph, const Profile& profile,
                                        const FusionOptions& fusion, const AdviceOptions& options,
                                        const PassRegistry& passes) {
  FT_CHECK(profile.ops.size() == graph.ops.size(), "profile has ", profile.ops.size(),
           " ops but the graph has ", graph.ops.size(), ": it was taken on another graph");
  const GraphIndex index(graph);
  std::map<std::string, FusionAdvice> vertical, horizontal;
  add_vertical(graph, index, profile, fusion, options, passes, vertical);
  add_horizontal(graph, index, profile, fusion, options, passes, horizontal);
  std::vector<FusionAdvice> advice;
  for (auto& entry : vertical) advice.push_back(std::move(entry.second));
  std::stable_sort(advice.begin(), advice.end(), [](const FusionAdvice& a, const FusionAdvice& b) {
    return a.intermediate_bytes > b.intermediate_bytes;
  });
  const size_t first_horizontal = advice.size();
  for (auto& entry : horizontal) advice.push_back(std::move(entry.second));
  std::stable_sort(advice.begin() + first_horizontal, advice.end(),
                   [](const FusionAdvice& a, const FusionAdvice& b) {
                     return a.dispatch_share > b.dispatch_share;
                   });
  return advice;
}

std::string describe_advice(const FusionAdvice& advice) {
  char head[256];
  const bool vertical = advice.direction == FusionDirection::kVertical;
  if (vertical)
    std::snprintf(head, sizeof(head),
                  "vertical   %s: %zu site(s), %.3f ms/step, %.0f KiB "
                  "single-consumer intermediate",
                  advice.pattern.c_str(), advice.sites.size(), advice.ms_per_step,
                  advice.intermediate_bytes / 1024);
  else
    std::snprintf(head, sizeof(head),
                  "horizontal %s: %zu famil%s, %.3f ms/step, dispatch %.0f%% "
                  "of its time",
                  advice.pattern.c_str(), advice.sites.size(),
                  advice.sites.size() == 1 ? "y" : "ies", advice.ms_per_step,
                  100.0 * advice.dispatch_share);
  std::string text = head;
  const std::string& key = advice.pass_key;
  const char* by_default = advice.default_on ? "on by default" : "off by default";
  if (key.empty())
    text += " -> no pass covers it";
  else if (advice.pass_on())
    text += " -> " + key + " is on, yet these sites are unfused (`fusiontrain plan` shows why)";
  else if (advice.key_on)
    text +=
        " -> " + key + " is on in this config (" + by_default + "), but fusion.enabled is false";
  else
    text += " -> " + key + " is off in this config (" + by_default + "): --set " + key + "=true" +
            (advice.fusion_enabled ? "" : " and fusion.enabled=true");
  return text + "\n    e.g. " + advice.sites.front();
}

std::string format_advice(const std::vector<FusionAdvice>& advice, const AdviceOptions& options) {
  char head[256];
  std::snprintf(head, sizeof(head),
                "fusion advice (dispatch %.2f us per op call; horizontal: dispatch > %.0f%% of "
                "a family's time; vertical: single-consumer intermediate > %.0f KiB)\n",
                1e3 * options.dispatch_ms, 100.0 * options.min_dispatch_share,
                options.min_intermediate_bytes / 1024);
  std::string text = head;
  if (advice.empty()) text += "  none\n";
  for (const FusionAdvice& item : advice) text += "  " + describe_advice(item) + "\n";
  return text;
}

nlohmann::json advice_json(const std::vector<FusionAdvice>& advice, const AdviceOptions& options) {
  nlohmann::json items = nlohmann::json::array();
  for (const FusionAdvice& item : advice) {
    nlohmann::json row = {
        {"direction", item.direction == FusionDirection::kVertical ? "vertical" : "horizontal"},
        {"pattern", item.pattern},
        {"sites", item.sites},
        {"pass", item.pass_key.empty() ? nlohmann::json(nullptr) : nlohmann::json(item.pass_key)},
        {"key_on", item.key_on},
        {"pass_on", item.pass_on()},
        {"default_on", item.default_on},
        {"ms_per_step", item.ms_per_step},
        {"text", describe_advice(item)}};
    if (item.direction == FusionDirection::kVertical)
      row["intermediate_bytes"] = item.intermediate_bytes;
    else
      row["dispatch_share"] = item.dispatch_share;
    items.push_back(row);
  }
  return {{"dispatch_ms", options.dispatch_ms},
          {"min_dispatch_share", options.min_dispatch_share},
          {"min_intermediate_bytes", options.min_intermediate_bytes},
          {"items", items}};
}

}  // namespace ft

// libFuzzer target: `fusiontrain bench --variants` / `--ablation` / `--sweep`
// (app/analysis/bench.cpp), and the configs bench builds from them (app/jobs/bench_job.cpp's
// variant_config: the config file, then each variant's overrides, through the config reader).
// Input: one mode byte, then the flag's value. 's': --sweep VALUE; 'a': --variants VALUE
// --ablation; anything else: --variants VALUE. Every variant of an accepted list must have a
// unique, non-empty name and at least one override; the overrides of the first kMaxConfigs
// variants are applied to a small GPT config (a refusal there is fine: the override names an
// unknown key or a bad value). Refusals (ft::Error) are fine.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "app/analysis/bench.h"
#include "app/config/config.h"
#include "core/check.h"
#include "fuzz/fuzz_util.h"

namespace {

constexpr size_t kMaxConfigs = 8;

constexpr char kBaseConfig[] =
    "model:\n  arch: gpt\n  n_layer: 2\n  n_head: 2\n  d_model: 32\n  seq_len: 16\n"
    "train:\n  steps: 10\n  batch_size: 2\n";

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ft_fuzz::silence_stdout();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const char mode = static_cast<char>(data[0]);
  const std::string value(reinterpret_cast<const char*>(data) + 1, size - 1);

  std::vector<ft::BenchVariant> variants;
  try {
    variants =
        mode == 's' ? ft::expand_bench_sweep(value) : ft::expand_bench_variants(value, mode == 'a');
  } catch (const ft::Error&) {
    return 0;
  }

  if (variants.empty()) ft_fuzz::finding("an accepted variant list is empty");
  std::set<std::string> names;
  for (const ft::BenchVariant& variant : variants) {
    if (variant.name.empty()) ft_fuzz::finding("a variant has an empty name");
    if (!names.insert(variant.name).second)
      ft_fuzz::finding("variant '" + variant.name + "' appears twice");
    if (variant.overrides.empty())
      ft_fuzz::finding("variant '" + variant.name + "' has no override");
    for (const std::string& override_text : variant.overrides)
      if (override_text.find('=') == std::string::npos || override_text[0] == '=')
        ft_fuzz::finding("variant '" + variant.name + "' has override '" + override_text +
                         "', not key=value");
    (void)ft::bench_comm_only_variant(variant);
  }

  for (size_t v = 0; v < variants.size() && v < kMaxConfigs; ++v) {
    try {
      ft::parse_config(kBaseConfig, "fuzz.yaml", variants[v].overrides);
    } catch (const ft::Error&) {
    }
  }
  return 0;
}

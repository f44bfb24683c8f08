#include "fusion/pass_registry.h"

#include <algorithm>

#include "core/check.h"
#include "fusion/pass_infos.h"

namespace ft {
namespace {

bool lists(const std::vector<std::string>& names, const char* name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

// The one list of keys, in run order. cuda_graph is no entry: it replays the whole step,
// whatever the passes did. FusionPipeline::standard() must list the same passes in this order.
const PassRegistry& PassRegistry::standard() {
  static const PassRegistry registry = [] {
    PassRegistry list;
    for (const PassInfo& (*info)() :
         {fold_bn_info, qkv_info, batched_layernorm_info, multi_tensor_info, conv_shortcut_info,
          gemm_epilogue_info, residual_layernorm_info, classifier_info, attention_info,
          bn_relu_info, cast_info})
      list.add(info());
    list.check_after_names();
    return list;
  }();
  return registry;
}

void PassRegistry::add(const PassInfo& info) {
  for (const PassInfo* entry : entries_) {
    FT_CHECK(info.key() != entry->key(), "fusion pipeline lists key '", info.key(), "' twice");
    if (lists(entry->after, info.name))
      FT_FAIL("fusion pipeline order: pass '", entry->name, "' must run after '", info.name,
              "' (its PassInfo::after says so), but '", info.name,
              "' is listed after it; move it up in the list (fusion/pass_registry.cpp and "
              "fusion/pipeline.cpp)");
  }
  entries_.push_back(&info);
}

void PassRegistry::check_after_names() const {
  for (const PassInfo* entry : entries_)
    for (const std::string& name : entry->after)
      FT_CHECK(std::any_of(entries_.begin(), entries_.end(),
                           [&](const PassInfo* other) { return name == other->name; }),
               "fusion pass '", entry->name, "' must run after '", name,
               "', which is no pass of the list");
}

std::vector<std::string> PassRegistry::keys(PassFamily family) const {
  std::vector<std::string> keys;
  for (const PassInfo* entry : entries_)
    if (entry->family == family) keys.push_back(entry->key());
  return keys;
}

const PassInfo* PassRegistry::find_key(const std::string& key) const {
  for (const PassInfo* entry : entries_)
    if (entry->key() == key) return entry;
  return nullptr;
}

}  // namespace ft

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

// fusion/standard_passes.def's entries, in its order.
const PassRegistry& PassRegistry::standard() {
  static const PassRegistry registry = [] {
    PassRegistry list;
#define FT_PASS(name) list.add(name##_info());
#define FT_SWITCH(name) FT_PASS(name)
#include "fusion/standard_passes.def"
#undef FT_SWITCH
#undef FT_PASS
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
              "' is listed after it; move it up in the list (fusion/standard_passes.def)");
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

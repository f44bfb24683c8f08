// Internal to app/config/config*.cpp: the one table describing every config key (where it lives in
// Config, its type, what values it allows, a one-line doc) and the helpers that read, write and
// describe a key through that table. Not part of the public API; include app/config/config.h
// instead. Thread safety: the table is built once (static local) and read-only afterwards.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "app/config/config.h"
#include "fusion/pass_registry.h"

namespace ft::config_schema {

// A pass registry key's bool (fusion/pass_registry.h): PassInfo::flag applied to Config::fusion.
struct PassFlagRef {
  bool* (*flag)(FusionOptions&);
  bool* operator()(Config& config) const { return flag(config.fusion); }
};

// Where a key's value lives inside a Config; the alternative also gives the key's type.
using FieldRef =
    std::variant<int* (*)(Config&), uint64_t* (*)(Config&), float* (*)(Config&),
                 double* (*)(Config&), bool* (*)(Config&), std::string* (*)(Config&), PassFlagRef>;

// What a key accepts. Numbers use [lo, hi] with optional open ends; strings use `choices`
// (empty = free text) and `nonempty`; bools accept exactly true/false.
struct Allowed {
  double lo = 0, hi = 0;
  bool lo_open = false, hi_open = false;
  std::vector<std::string> choices;
  bool nonempty = false;
};

struct Field {
  std::string key;  // dotted, e.g. "comm.emulate.latency_us"
  FieldRef ref;
  Allowed allowed;
  std::string doc;
};

struct Section {
  std::string name;  // dotted, e.g. "comm.emulate"
  std::string doc;
};

// Schema order is declaration order; every listing (flatten, YAML, docs) follows it.
const std::vector<Field>& fields();
// The table itself, built once by fields() (app/config/config_fields.cpp) from the standard
// registry; its fusion.vertical.*, fusion.horizontal.* and inference.* pass rows come from
// `passes`.
std::vector<Field> build_fields(const PassRegistry& passes = PassRegistry::standard());
// The bool keys of `family` in `passes`, in list order, with each PassInfo's doc.
std::vector<Field> pass_fields(const PassRegistry& passes, PassFamily family);
const std::vector<Section>& sections();  // parents come before their subsections

const Field* find_field(const std::string& key);  // nullptr if unknown
bool is_section(const std::string& name);
// Short names of the keys and subsections directly inside `section` ("" = the top level).
std::vector<std::string> children(const std::string& section);

std::string type_name(const Field& field);         // int, uint64, float, bool, string
std::string describe_allowed(const Field& field);  // "an integer in [1, 64]", "one of: adamw, sgd"
std::string format_value(const Field& field, const Config& config);  // plain text, unquoted
// Parses `text` into the field. `quoted` says the YAML scalar was quoted, which only strings
// accept. Returns "" on success, else what is wrong ("expected ..., got '...'").
std::string assign_value(const Field& field, Config& config, const std::string& text, bool quoted);

// The first comment line of config_to_yaml's output. A file holding it is a resolved dump (a run's
// config.yaml, a checkpoint's embedded config, tune's output), which lists every key by design.
inline constexpr const char* kResolvedHeader =
    "# Resolved fusiontrain config: every key, with defaults filled in.";

// Where the keys of one parse got their values.
struct KeySources {
  std::map<std::string, std::string> set_at;  // dotted key -> file:line:col or --set '...'
  // Keys whose value came from a resolved dump (and no --set after it). A dump has to list the
  // keys its configuration ignores, so only a non-default value there counts as set.
  std::set<std::string> from_dump;
};

// The cross-field checks (app/config/config_checks.cpp), after every source was applied: bad
// combinations, and keys that were set although the configuration ignores them. Throws ft::Error
// naming `origin`, each key with its value and where it was set, and what to do.
void check_config(const Config& config, const std::string& origin, const KeySources& sources);

size_t edit_distance(const std::string& a, const std::string& b);
// The candidate closest to `word`; "" if none is close enough to be a plausible typo.
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);
std::string did_you_mean(const std::string& suggestion);  // " (did you mean '...'?)" or ""
std::string join(const std::vector<std::string>& items, const std::string& separator);

}  // namespace ft::config_schema

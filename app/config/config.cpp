// Strict config reading: YAML file → schema-checked values → `--set` overrides → cross-field
// checks. Every error names where the value came from (file:line:col or the override).
#include "app/config/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "app/config/config_schema.h"
#include "app/config/yaml_documents.h"
#include "core/check.h"

namespace ft {
using namespace config_schema;

namespace {

std::string location(const std::string& origin, const YAML::Mark& mark) {
  if (mark.is_null()) return origin;
  return detail::concat(origin, ":", mark.line + 1, ":", mark.column + 1);
}

std::string parent_of(const std::string& dotted) {
  size_t dot = dotted.rfind('.');
  return dot == std::string::npos ? "" : dotted.substr(0, dot);
}

// "tag:yaml.org,2002:str" as written in the file: "!!str".
std::string short_tag(const std::string& tag) {
  const std::string core = "tag:yaml.org,2002:";
  return tag.compare(0, core.size(), core) == 0 ? "!!" + tag.substr(core.size()) : tag;
}

const char* kind_of(const YAML::Node& node) {
  if (node.IsNull()) return "no value";
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  return "a single value";
}

// "valid keys in 'model': arch, n_layer, ..." for a section ("" = the top level).
std::string valid_keys_text(const std::string& section) {
  const std::vector<std::string> valid = children(section);
  if (section.empty()) return "valid sections: " + join(valid, ", ");
  if (valid.empty()) return "section '" + section + "' has no keys yet";
  return "valid keys in '" + section + "': " + join(valid, ", ");
}

// The field whose last name is `name`, if any: a key put in the wrong section is a common slip.
const Field* field_named(const std::string& name) {
  for (const Field& field : fields())
    if (field.key.size() > name.size() &&
        field.key.compare(field.key.size() - name.size(), name.size(), name) == 0 &&
        field.key[field.key.size() - name.size() - 1] == '.')
      return &field;
  return nullptr;
}

// A key that no longer exists, and what to use instead. Resolved dumps written before it went
// (every older checkpoint's embedded config and run config.yaml) list it with its old default,
// which is skipped there so they still load; anything else naming it is refused.
struct RetiredKey {
  const char* key;
  const char* old_default;
  const char* instead;
};

constexpr RetiredKey kRetiredKeys[] = {
    {"inference.checkpoint", "",
     "pass the checkpoint with --checkpoint FILE (sample, eval, export); without --config they "
     "also read the model's config from it"},
};

const RetiredKey* find_retired(const std::string& key) {
  for (const RetiredKey& retired : kRetiredKeys)
    if (key == retired.key) return &retired;
  return nullptr;
}

// Whether `text` holds config_to_yaml's header line (tune puts a line of its own above it).
bool is_resolved_dump(const std::string& text) {
  const std::string header = kResolvedHeader;
  for (size_t at = text.find(header); at != std::string::npos; at = text.find(header, at + 1)) {
    const size_t end = at + header.size();
    if ((at == 0 || text[at - 1] == '\n') &&
        (end == text.size() || text[end] == '\n' || text[end] == '\r'))
      return true;
  }
  return false;
}

// Applies one source of values after another to a Config, remembering where each key was set
// so cross-field errors can point at both culprits.
class Reader {
 public:
  explicit Reader(std::string origin) : origin_(std::move(origin)) {
    config_.source_path = origin_;
  }

  void read_document(const std::string& text) {
    resolved_dump_ = is_resolved_dump(text);
    // Counted first, with a bound: YAML::LoadAll of yaml-cpp 0.7 can loop for ever (see
    // app/config/yaml_documents.h), so only a text of exactly one document reaches YAML::Load.
    YAML::Node root;
    try {
      const YamlDocuments documents = scan_yaml_documents(text);
      YAML::Mark where = YAML::Mark::null_mark();
      where.line = documents.line;
      where.column = documents.column;
      if (documents.stuck)
        FT_FAIL(location(origin_, where),
                ": YAML syntax error: this token begins no value (a stray ',', or a '!' tag or "
                "'&' anchor with nothing after it); a config is a map of sections such as "
                "'train:' with 'key: value' lines under them");
      if (documents.count > 1)
        FT_FAIL(location(origin_, where), ": expected one YAML document, found ",
                documents.capped ? "more than " : "", documents.count,
                " (remove the '---' separators)");
      if (documents.count == 1) root = YAML::Load(text);
    } catch (const YAML::Exception& error) {
      FT_FAIL(location(origin_, error.mark), ": YAML syntax error: ", error.msg);
    }
    if (root.IsNull())
      FT_FAIL(origin_, ": config file is empty (it has no keys, only comments or blank lines)");
    if (!root.IsMap())
      FT_FAIL(location(origin_, root.Mark()), ": the top level must be a map of sections, got ",
              kind_of(root), "; ", valid_keys_text(""));
    read_section(root, "");
  }

  void apply_override(const std::string& assignment) {
    // Shown with any NUL byte spelled \0: a message is a C string, cut at the first NUL.
    std::string shown;
    for (char c : assignment) shown += c == '\0' ? std::string("\\0") : std::string(1, c);
    const std::string where = "--set '" + shown + "'";
    const size_t equals = assignment.find('=');
    if (equals == std::string::npos || equals == 0)
      FT_FAIL(where, ": expected section.key=value, e.g. --set model.n_layer=6");
    const std::string key = assignment.substr(0, equals);
    if (is_section(key))
      FT_FAIL(where, ": '", key, "' is a section, not a key; ", valid_keys_text(key));
    if (const RetiredKey* retired = find_retired(key))
      FT_FAIL(where, ": ", key, " was removed: ", retired->instead);
    const Field* field = find_field(key);
    if (field == nullptr) {
      std::vector<std::string> all_keys;
      for (const Field& known : fields()) all_keys.push_back(known.key);
      const Field* moved = field_named(key.substr(key.rfind('.') + 1));
      std::string section = parent_of(key);
      while (!section.empty() && !is_section(section)) section = parent_of(section);
      FT_FAIL(where, ": unknown key '", key, "'",
              did_you_mean(moved ? moved->key : nearest(key, all_keys)), "; ",
              valid_keys_text(section));
    }
    const std::string problem = assign_value(*field, config_, assignment.substr(equals + 1), false);
    if (!problem.empty()) FT_FAIL(where, ": ", key, ": ", problem);
    sources_.set_at[key] = where;
    sources_.from_dump.erase(key);
  }

  // Defaults that only make sense for long runs shrink to fit a short one, with a note; so does a
  // value a resolved dump (a run's config.yaml, tune's output) carries, since that run fitted or
  // defaulted it for its own length. A value the user set is never changed (validate() refuses it
  // instead).
  void fit_defaults() {
    OptimConfig& optim = config_.optim;
    const std::string key = "optim.warmup_steps";
    const bool from_dump = sources_.from_dump.count(key) > 0;
    if ((sources_.set_at.count(key) == 0 || from_dump) &&
        optim.warmup_steps > config_.train.steps) {
      // Once per job: under mpirun only world rank 0 says it (every rank applies it).
      const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
      if (rank == nullptr || std::string(rank) == "0") {
        std::printf("note: optim.warmup_steps %s %d, more than train.steps = %d; using %d\n",
                    from_dump ? "in the resolved config is" : "defaults to", optim.warmup_steps,
                    config_.train.steps, config_.train.steps);
        std::fflush(stdout);
      }
      optim.warmup_steps = config_.train.steps;
    }
  }

  void validate() const { check_config(config_, origin_, sources_); }

  Config take() { return std::move(config_); }

 private:
  void read_section(const YAML::Node& map, const std::string& section) {
    std::map<std::string, YAML::Mark> first_seen;
    for (const auto& entry : map) {
      const YAML::Node& key_node = entry.first;
      const YAML::Node& value = entry.second;
      const std::string where = location(origin_, key_node.Mark());
      if (!key_node.IsScalar())
        FT_FAIL(where, ": keys must be plain names; ", valid_keys_text(section));
      const std::string& key = key_node.Scalar();
      const std::string dotted = section.empty() ? key : section + "." + key;
      auto [previous, fresh] = first_seen.emplace(key, key_node.Mark());
      if (!fresh)
        FT_FAIL(where, ": duplicate key '", dotted, "' (first set at line ",
                previous->second.line + 1, ")");
      if (is_section(dotted)) {
        if (value.IsNull()) continue;  // "fusion:" with nothing under it is an empty section
        if (!value.IsMap())
          FT_FAIL(where, ": section '", dotted, "' must be a map of keys, got ", kind_of(value),
                  "; ", valid_keys_text(dotted));
        read_section(value, dotted);
      } else if (const Field* field = find_field(dotted)) {
        const bool is_string = std::holds_alternative<std::string* (*)(Config&)>(field->ref);
        if (!value.IsScalar())
          FT_FAIL(where, ": ", dotted, ": expected ", describe_allowed(*field), ", got ",
                  kind_of(value),
                  value.IsNull() && is_string ? " (write \"\" for an empty string)" : "");
        const std::string value_at = location(origin_, value.Mark());
        // "?" = a plain scalar, "!" = a quoted one; anything else is an explicit tag.
        if (value.Tag() != "?" && value.Tag() != "!")
          FT_FAIL(value_at, ": ", dotted, ": expected ", describe_allowed(*field),
                  ", got a value with the YAML tag '", short_tag(value.Tag()),
                  "'; tags are not accepted, write the plain value");
        const std::string problem =
            assign_value(*field, config_, value.Scalar(), value.Tag() == "!");
        if (!problem.empty()) FT_FAIL(value_at, ": ", dotted, ": ", problem);
        sources_.set_at[dotted] = value_at;
        if (resolved_dump_) sources_.from_dump.insert(dotted);
      } else if (const RetiredKey* retired = find_retired(dotted)) {
        if (resolved_dump_ && value.IsScalar() && value.Scalar() == retired->old_default) continue;
        FT_FAIL(where, ": ", dotted, " was removed: ", retired->instead);
      } else {
        FT_FAIL(where, ": ", unknown_key_text(section, key));
      }
    }
  }

  static std::string unknown_key_text(const std::string& section, const std::string& key) {
    std::string text = section.empty() ? "unknown section '" + key + "'"
                                       : "unknown key '" + key + "' in section '" + section + "'";
    if (const Field* moved = field_named(key))
      text += "; '" + key + "' belongs in section '" + parent_of(moved->key) + "'";
    else
      text += did_you_mean(nearest(key, children(section)));
    return text + "; " + valid_keys_text(section);
  }

  std::string origin_;
  Config config_;
  KeySources sources_;
  bool resolved_dump_ = false;  // the file is config_to_yaml output (see KeySources::from_dump)
};

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& origin,
                    const std::vector<std::string>& overrides) {
  Reader reader(origin);
  reader.read_document(yaml_text);
  for (const std::string& assignment : overrides) reader.apply_override(assignment);
  reader.fit_defaults();
  reader.validate();
  return reader.take();
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::exists(path, error))
    FT_FAIL(path, ": config file not found (working directory: ", fs::current_path(error).string(),
            ")");
  if (fs::is_directory(path, error)) FT_FAIL(path, ": is a directory, not a config file");
  // O_NONBLOCK: open() of a FIFO with no writer would block for ever before the check below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) FT_FAIL(path, ": cannot open config file: ", std::strerror(errno));
  struct stat info {};
  const bool stat_ok = ::fstat(fd, &info) == 0;
  ::close(fd);
  if (!stat_ok) FT_FAIL(path, ": cannot stat config file: ", std::strerror(errno));
  // A pipe or device has no size to check and may never end (or never start): a config is a file.
  if (!S_ISREG(info.st_mode))
    FT_FAIL(path, ": is ",
            S_ISFIFO(info.st_mode)   ? "a pipe"
            : S_ISCHR(info.st_mode)  ? "a character device"
            : S_ISSOCK(info.st_mode) ? "a socket"
                                     : "not a regular file",
            ", not a config file; write the config to a file and pass its path");
  if (static_cast<uint64_t>(info.st_size) > kMaxConfigBytes)
    FT_FAIL(path, ": config file is larger than ", kMaxConfigBytes / (1024 * 1024),
            " MiB (the limit for a config); is it the right file?");
  std::ifstream in(path, std::ios::binary);
  if (!in) FT_FAIL(path, ": cannot open config file: ", std::strerror(errno));
  // At most one byte past the cap, should the file have grown since fstat.
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) FT_FAIL(path, ": error while reading config file");
  if (static_cast<uint64_t>(in.gcount()) > kMaxConfigBytes)
    FT_FAIL(path, ": config file is larger than ", kMaxConfigBytes / (1024 * 1024),
            " MiB (the limit for a config); is it the right file?");
  text.resize(static_cast<size_t>(in.gcount()));
  Config config = parse_config(text, path, overrides);
  config.data.path = find_data_file(config.data.path, path);
  return config;
}

std::string find_data_file(const std::string& data_path, const std::string& config_path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (data_path.empty() || fs::path(data_path).is_absolute() || fs::exists(data_path, error))
    return data_path;
  for (fs::path folder = fs::absolute(config_path, error).parent_path(); !folder.empty();
       folder = folder.parent_path()) {
    const fs::path candidate = folder / data_path;
    if (fs::exists(candidate, error)) return candidate.lexically_normal().string();
    if (folder == folder.root_path()) break;
  }
  return data_path;  // the loader says it is missing, and where relative paths are looked up
}

}  // namespace ft

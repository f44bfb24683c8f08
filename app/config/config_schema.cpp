// The config schema table and everything generated from it: value parsing and printing,
// flatten_config, config_to_yaml and config_reference_markdown.
#include "app/config/config_schema.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace ft::config_schema {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The shortest text that reads back to exactly `value`.
template <typename T>
std::string format_number(T value) {
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

// A value inside the allowed range as a double can still leave it once stored as a float: 1e-50
// becomes 0, 0.99999999999 becomes 1, and 1e-40 becomes a subnormal that flush-to-zero turns into
// 0. Returns what is wrong ("" when the float keeps the value in range).
std::string float_rounding_problem(const Allowed& allowed, const std::string& text, double value) {
  const float stored = static_cast<float>(value);
  const double back = static_cast<double>(stored);
  const std::string lo = format_number(allowed.lo), hi = format_number(allowed.hi);
  if (allowed.lo_open && back <= allowed.lo)
    return text + " rounds to " + format_number(stored) + " as a float; must be above " + lo;
  if (allowed.hi_open && back >= allowed.hi)
    return text + " rounds to " + format_number(stored) + " as a float; must be below " + hi;
  if (back < allowed.lo || back > allowed.hi)
    return text + " rounds to " + format_number(stored) + " as a float, outside [" + lo + ", " +
           hi + "]";
  const float smallest = std::numeric_limits<float>::min();
  const bool zero_allowed = allowed.lo < 0 || (allowed.lo == 0 && !allowed.lo_open);
  if (stored != 0.0f && std::fabs(stored) < smallest)
    return text + " is too small for a float: below " + format_number(smallest) +
           ", the smallest normal float, it would be flushed to 0; use " +
           (zero_allowed ? "0 or " : "") + "at least " + format_number(smallest);
  return "";
}

// Why a choice the schema once had or a user may expect is refused, appended to the error.
std::string refusal_hint(const std::string& key, const std::string& text) {
  if (key == "train.device" && (text == "gpu" || text.rfind("cuda:", 0) == 0))
    return "; the GPU is spelled cuda (each rank takes its own GPU: its local rank modulo the "
           "device count)";
  return "";
}

// Config is only read here; the accessors take a mutable Config so one table serves both ways.
template <typename T>
const T& read(T* (*accessor)(Config&), const Config& config) {
  return *accessor(const_cast<Config&>(config));
}
const bool& read(PassFlagRef accessor, const Config& config) {
  return *accessor(const_cast<Config&>(config));
}

}  // namespace

const std::vector<Field>& fields() {
  static const std::vector<Field> table = build_fields();
  return table;
}

const std::vector<Section>& sections() {
  static const std::vector<Section> table = {
      {"model", "Network architecture."},
      {"train", "Training loop, logging, checkpoints and device."},
      {"optim",
       "Optimizer and learning-rate schedule (linear warmup, then cosine decay to min_lr)."},
      {"data", "Data sets and augmentation."},
      {"fusion",
       "Compute fusion: graph passes between model/ and the executor, each with its unfused twin."},
      {"fusion.vertical", "Chains of ops whose intermediates no longer round-trip through memory."},
      {"fusion.horizontal", "Independent ops of one kind in one launch."},
      {"comm", "Gradient communication between data-parallel ranks."},
      {"comm.emulate", "Slow-network emulation: both keys 0 = off."},
      {"inference",
       "Text generation and evaluation from a checkpoint (given as --checkpoint FILE)."},
  };
  return table;
}

const Field* find_field(const std::string& key) {
  for (const Field& field : fields())
    if (field.key == key) return &field;
  return nullptr;
}

bool is_section(const std::string& name) {
  return std::any_of(sections().begin(), sections().end(),
                     [&](const Section& section) { return section.name == name; });
}

std::vector<std::string> children(const std::string& section) {
  const std::string prefix = section.empty() ? "" : section + ".";
  std::vector<std::string> names;
  auto add_direct_child = [&](const std::string& dotted) {
    if (dotted.compare(0, prefix.size(), prefix) != 0) return;
    std::string rest = dotted.substr(prefix.size());
    if (rest.empty() || rest.find('.') != std::string::npos) return;
    names.push_back(rest);
  };
  for (const Field& field : fields()) add_direct_child(field.key);
  for (const Section& sub : sections()) add_direct_child(sub.name);
  return names;
}

std::string type_name(const Field& field) {
  static const char* const kNames[] = {"int", "uint64", "float", "float", "bool", "string", "bool"};
  return kNames[field.ref.index()];
}

std::string describe_allowed(const Field& field) {
  const Allowed& allowed = field.allowed;
  if (std::holds_alternative<bool* (*)(Config&)>(field.ref) ||
      std::holds_alternative<PassFlagRef>(field.ref))
    return "true or false";
  if (std::holds_alternative<std::string* (*)(Config&)>(field.ref)) {
    if (!allowed.choices.empty()) return "one of: " + join(allowed.choices, ", ");
    return allowed.nonempty ? "a non-empty string" : "any string";
  }
  // Whole bounds print as integers: "[1, 1000000]" reads better than "[1, 1e+06]".
  auto bound = [](double value) {
    return value == std::floor(value) ? std::to_string(static_cast<long long>(value))
                                      : format_number(value);
  };
  std::string what = field.ref.index() <= 1 ? "an integer" : "a number";
  if (allowed.hi == kInf) return what + (allowed.lo_open ? " > " : " >= ") + bound(allowed.lo);
  return what + " in " + (allowed.lo_open ? "(" : "[") + bound(allowed.lo) + ", " +
         bound(allowed.hi) + (allowed.hi_open ? ")" : "]");
}

std::string format_value(const Field& field, const Config& config) {
  return std::visit(
      [&](auto accessor) -> std::string {
        const auto& value = read(accessor, config);
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, std::string>)
          return value;
        else if constexpr (std::is_same_v<T, bool>)
          return value ? "true" : "false";
        else if constexpr (std::is_integral_v<T>)
          return std::to_string(value);
        else
          return format_number(value);
      },
      field.ref);
}

std::string assign_value(const Field& field, Config& config, const std::string& text, bool quoted) {
  const Allowed& allowed = field.allowed;
  const std::string expected = "expected " + describe_allowed(field) + ", got ";
  const std::string got = "'" + text + "'";
  return std::visit(
      [&](auto accessor) -> std::string {
        auto& target = *accessor(config);
        using T = std::decay_t<decltype(target)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (allowed.nonempty && text.empty()) return expected + "an empty string";
          // Every C call (open, mkdir) would see the text cut at a NUL: a path that is not this.
          if (text.find('\0') != std::string::npos)
            return expected +
                   "a string holding a NUL byte (\\0 or \\x00), which no path or "
                   "name may hold";
          if (!allowed.choices.empty() && std::find(allowed.choices.begin(), allowed.choices.end(),
                                                    text) == allowed.choices.end())
            return expected + got + did_you_mean(nearest(text, allowed.choices)) +
                   refusal_hint(field.key, text);
          target = text;
          return "";
        } else {
          if (quoted) return expected + "the quoted string " + got + " (remove the quotes)";
          if constexpr (std::is_same_v<T, bool>) {
            if (text != "true" && text != "false") return expected + got;
            target = text == "true";
          } else if constexpr (std::is_same_v<T, uint64_t>) {
            uint64_t value = 0;
            const char* end = text.data() + text.size();
            auto result = std::from_chars(text.data(), end, value);
            if (result.ec != std::errc() || result.ptr != end || text.empty())
              return expected + got;
            target = value;
          } else {
            double value = 0;
            const char* end = text.data() + text.size();
            std::from_chars_result result{};
            if constexpr (std::is_integral_v<T>) {
              long long integer = 0;
              result = std::from_chars(text.data(), end, integer);
              value = static_cast<double>(integer);
            } else {
              result = std::from_chars(text.data(), end, value);
            }
            if (result.ec == std::errc::invalid_argument || result.ptr != end ||
                !std::isfinite(value))
              return expected + got;
            const double hi =
                std::is_integral_v<T> ? std::min(allowed.hi, double(INT_MAX)) : allowed.hi;
            if (result.ec != std::errc() || value < allowed.lo || value > hi ||
                (allowed.lo_open && value == allowed.lo) || (allowed.hi_open && value == hi))
              return expected + text;
            if constexpr (std::is_same_v<T, float>) {
              const std::string problem = float_rounding_problem(allowed, text, value);
              if (!problem.empty()) return problem + " (" + expected + text + ")";
            }
            target = static_cast<T>(value);
          }
          return "";
        }
      },
      field.ref);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> previous(b.size() + 1), current(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      current[j] = std::min(
          {previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  // Beyond this distance a "suggestion" is noise; the caller lists every valid key anyway.
  size_t best_distance = std::max<size_t>(3, word.size() / 2) + 1;
  std::string best;
  for (const std::string& candidate : candidates) {
    size_t distance = edit_distance(word, candidate);
    if (distance < best_distance) best = candidate, best_distance = distance;
  }
  return best;
}

std::string did_you_mean(const std::string& suggestion) {
  return suggestion.empty() ? "" : " (did you mean '" + suggestion + "'?)";
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string joined;
  for (size_t i = 0; i < items.size(); ++i) joined += (i ? separator : "") + items[i];
  return joined;
}

}  // namespace ft::config_schema

namespace ft {
using namespace config_schema;

namespace {

// A YAML double-quoted scalar, so any path or name reads back unchanged.
std::string yaml_quote(const std::string& text) {
  std::string quoted = "\"";
  for (unsigned char ch : text) {
    if (ch == '"' || ch == '\\') {
      quoted += '\\';
      quoted += static_cast<char>(ch);
    } else if (ch < 0x20 || ch == 0x7f) {
      char escape[8];
      std::snprintf(escape, sizeof(escape), "\\x%02x", ch);
      quoted += escape;
    } else {
      quoted += static_cast<char>(ch);
    }
  }
  return quoted + "\"";
}

std::string parent_of(const std::string& dotted) {
  size_t dot = dotted.rfind('.');
  return dot == std::string::npos ? "" : dotted.substr(0, dot);
}

std::string markdown_cell(const std::string& text) {
  std::string cell;
  for (char ch : text) cell += ch == '|' ? std::string("\\|") : std::string(1, ch);
  return cell;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> flatten_config(const Config& config) {
  std::vector<std::pair<std::string, std::string>> flat;
  for (const Field& field : fields()) flat.emplace_back(field.key, format_value(field, config));
  return flat;
}

std::string config_to_yaml(const Config& config) {
  std::ostringstream out;
  out << kResolvedHeader << "\n";
  for (const Section& section : sections()) {
    const std::string indent(2 * std::count(section.name.begin(), section.name.end(), '.'), ' ');
    const std::string short_name = section.name.substr(section.name.rfind('.') + 1);
    out << indent << short_name << (children(section.name).empty() ? ": {}\n" : ":\n");
    for (const Field& field : fields()) {
      if (parent_of(field.key) != section.name) continue;
      const std::string value = format_value(field, config);
      const bool is_string = std::holds_alternative<std::string* (*)(Config&)>(field.ref);
      out << indent << "  " << field.key.substr(section.name.size() + 1) << ": "
          << (is_string ? yaml_quote(value) : value) << "\n";
    }
  }
  return out.str();
}

std::string config_reference_markdown() {
  const Config defaults;
  std::ostringstream out;
  out << "# Configuration reference\n\n"
         "Generated from the schema in `app/config/config_schema.cpp` by "
         "`ft::config_reference_markdown()`;\n"
         "do not edit by hand. After changing the schema, regenerate it by running the "
         "`config_test`\n"
         "binary with `FT_UPDATE_DOCS=1` set.\n\n"
         "Every key can be set in the YAML file (nested by section) or overridden on the command "
         "line\n"
         "with `--set section.key=value` (nested: `--set comm.emulate.latency_us=20`). Unknown "
         "keys,\n"
         "values of the wrong type and values outside the allowed range are errors. Integers must "
         "be\n"
         "written as integers, booleans as `true` or `false`. A key the chosen configuration never "
         "reads is\n"
         "an error too: one marked (gpt) or (resnet) under the other `model.arch`, an AdamW or SGD "
         "one\n"
         "under the other `optim.name`, `train.max_skipped_steps` without `skip_step`. A resolved "
         "config\n"
         "(a run's `config.yaml`, a checkpoint's) lists every key, so there only a value other "
         "than the\n"
         "default counts as set.\n";
  for (const Section& section : sections()) {
    out << "\n## " << section.name << "\n\n" << section.doc << "\n";
    bool header_written = false;
    for (const Field& field : fields()) {
      if (parent_of(field.key) != section.name) continue;
      if (!header_written) {
        out << "\n| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
        header_written = true;
      }
      const std::string value = format_value(field, defaults);
      out << "| `" << field.key << "` | " << type_name(field) << " | "
          << (value.empty() ? "`\"\"`" : "`" + markdown_cell(value) + "`") << " | "
          << markdown_cell(describe_allowed(field)) << " | " << markdown_cell(field.doc) << " |\n";
    }
  }
  return out.str();
}

}  // namespace ft

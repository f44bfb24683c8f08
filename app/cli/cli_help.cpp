#include "app/cli/cli_help.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "app/config/config_schema.h"
#include "core/check.h"
#include "core/cuda_versions.h"

#ifndef FT_VERSION
#define FT_VERSION "unknown"
#endif
#ifndef FT_GIT_COMMIT
#define FT_GIT_COMMIT "unknown"
#endif

namespace ft {
namespace {

constexpr const char* kPresetDir = "configs";

std::vector<std::string> presets() {
  std::vector<std::string> found;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(kPresetDir, error))
    if (entry.path().extension() == ".yaml") found.push_back(entry.path().string());
  std::sort(found.begin(), found.end());
  return found;
}

std::string presets_line() {
  const std::vector<std::string> found = presets();
  if (found.empty()) return "no presets in ./configs (run from the source directory to use them)";
  return "presets: " + config_schema::join(found, ", ");
}

// Long option names of a job, as typed: "--config", "--set", "--help".
std::vector<std::string> flag_names(const CLI::App& job) {
  std::vector<std::string> names;
  for (const CLI::Option* option : job.get_options())
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
  return names;
}

// "--batch: 'abc' is not an integer" for CLI11's "Could not convert: --batch = abc", from the
// type of the flag; other messages unchanged.
std::string reword(const CLI::App* job, const std::string& message) {
  const std::string prefix = "Could not convert: ";
  const size_t equals = message.find(" = ");
  if (job == nullptr || message.rfind(prefix, 0) != 0 || equals == std::string::npos)
    return message;
  const std::string flag = message.substr(prefix.size(), equals - prefix.size());
  const std::string value = message.substr(equals + 3);
  const CLI::Option* option = job->get_option_no_throw(flag);
  // "INT", or "INT:POSITIVE" with a validator's name after the type.
  const std::string type = option != nullptr ? option->get_type_name() : "";
  const auto is = [&type](const char* name) { return type.rfind(name, 0) == 0; };
  // Digits that did not convert are a number beyond the flag's type.
  const bool digits =
      !value.empty() && value.find_first_not_of("+-0123456789") == std::string::npos;
  if (is("INT") || is("UINT"))
    return flag + ": '" + value + "' is " +
           (digits      ? "out of range"
            : is("INT") ? "not an integer"
                        : "not an integer >= 0");
  if (is("FLOAT")) return flag + ": '" + value + "' is not a number";
  return message;
}

}  // namespace

std::string version_text() {
  std::string text = std::string("fusiontrain ") + FT_VERSION + " (commit " + FT_GIT_COMMIT + ")";
#if defined(FT_HAVE_CUDA)
  // What this process loaded, which on a GPU image may differ from what the build saw.
  std::string lines = describe_cuda_versions(loaded_cuda_versions());
  lines.pop_back();  // CLI11 ends the version text with its own newline
  text += "\n" + lines;
#else
  text += "\nCUDA path: not built";
#endif
  return text;
}

void describe_jobs(CLI::App& app) {
  const std::string footer =
      "\n" + presets_line() +
      "\nEvery config key: README.md#configuration-reference or docs/config_reference.md"
      "\nOverride any key with --set section.key=value.\n";
  app.footer(footer);
  for (CLI::App* job : app.get_subcommands({})) {
    job->footer(footer);
    for (CLI::Option* option : job->get_options()) option->capture_default_str();
  }
}

namespace {

// The config keys whose last part is `name` ("steps" -> train.steps), for a flag that is one.
std::vector<std::string> keys_ending_in(const std::string& name) {
  std::vector<std::string> keys;
  for (const config_schema::Field& field : config_schema::fields()) {
    const size_t dot = field.key.rfind('.');
    if (field.key.compare(dot == std::string::npos ? 0 : dot + 1, std::string::npos, name) == 0)
      keys.push_back(field.key);
  }
  return keys;
}

// argv[i]'s value as a --set would take it: after '=' in argv[i], else argv[i + 1] unless that is
// a flag, else "VALUE".
std::string value_after(int argc, char** argv, int i) {
  const std::string word = argv[i];
  const size_t equals = word.find('=');
  if (equals != std::string::npos) return word.substr(equals + 1);
  if (i + 1 < argc && std::string(argv[i + 1]).rfind("-", 0) != 0) return argv[i + 1];
  return "VALUE";
}

// "--set train.steps 10" (the value as a word of its own): CLI11 would take 10 for an unexpected
// argument and the key alone for an assignment without a value.
std::string set_without_equals(int argc, char** argv, int i) {
  if (std::string(argv[i]) != "--set" || i + 1 >= argc) return "";
  const std::string key = argv[i + 1];
  if (key.empty() || key.find('=') != std::string::npos || key.rfind("-", 0) == 0) return "";
  return "--set '" + key + "' has no value: --set takes one word, key=value; write --set " + key +
         "=" + value_after(argc, argv, i + 1);
}

}  // namespace

std::string unknown_argument_error(CLI::App& app, int argc, char** argv, std::string* job_name) {
  if (argc < 2) return "";
  const std::string first = argv[1];
  if (first.rfind("-", 0) == 0) return "";  // --help, --version: CLI11's
  std::vector<std::string> jobs;
  CLI::App* job = nullptr;
  for (CLI::App* candidate : app.get_subcommands({})) {
    jobs.push_back(candidate->get_name());
    if (candidate->get_name() == first) job = candidate;
  }
  if (job == nullptr)
    return "unknown job '" + first + "'" +
           config_schema::did_you_mean(config_schema::nearest(first, jobs)) +
           "; jobs: " + config_schema::join(jobs, ", ");
  const std::vector<std::string> flags = flag_names(*job);
  for (int i = 2; i < argc; ++i) {
    std::string word = argv[i];
    if (word.rfind("--", 0) != 0) continue;
    word = word.substr(0, word.find('='));
    const std::string set_error = set_without_equals(argc, argv, i);
    if (!set_error.empty()) {
      *job_name = first;
      return set_error;
    }
    if (std::find(flags.begin(), flags.end(), word) != flags.end()) continue;
    *job_name = first;
    // A config key's last part as a flag (train --steps 10): its --set is what was meant.
    std::vector<std::string> sets;
    if (std::find(flags.begin(), flags.end(), "--set") != flags.end())
      for (const std::string& key : keys_ending_in(word.substr(2)))
        sets.push_back("--set " + key + "=" + value_after(argc, argv, i));
    if (!sets.empty())
      return "unknown flag '" + word + "' for " + first +
             "; config keys take --set: " + config_schema::join(sets, " or ") +
             "; its flags: " + config_schema::join(flags, " ");
    return "unknown flag '" + word + "' for " + first +
           config_schema::did_you_mean(config_schema::nearest(word, flags)) +
           "; its flags: " + config_schema::join(flags, " ");
  }
  return "";
}

void require_config_file(const std::string& path) {
  if (path.empty() || std::filesystem::exists(path)) return;
  const std::vector<std::string> found = presets();
  FT_FAIL("config file '", path, "' not found",
          config_schema::did_you_mean(config_schema::nearest(path, found)), "; ", presets_line());
}

int usage_error(const std::string& message, const std::string& job) {
  std::fprintf(stderr, "error: %s (run 'fusiontrain%s --help')\n", message.c_str(),
               job.empty() ? "" : (" " + job).c_str());
  return kUsageErrorExit;
}

int report_parse_error(CLI::App& app, const CLI::ParseError& error) {
  if (error.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(error);
  // The job being parsed when CLI11 stopped, for its --help.
  const std::vector<CLI::App*> parsed = app.get_subcommands();
  const CLI::App* job = parsed.empty() ? nullptr : parsed.back();
  return usage_error(reword(job, error.what()), job != nullptr ? job->get_name() : "");
}

// CLI11's PositiveNumber and NonNegativeNumber print their range as "0 to 1.8e308" and take inf.
CLI::Validator number_check(bool allow_zero) {
  return CLI::Validator(
      [allow_zero](std::string& text) -> std::string {
        double value = 0.0;
        const bool parsed = CLI::detail::lexical_cast(text, value);
        if (parsed && std::isfinite(value) && (allow_zero ? value >= 0.0 : value > 0.0)) return "";
        // A finite value below the bound gets wording true of integer and real flags alike (the
        // validator does not know which it checks): "-1" for --top-k is no "finite number" issue.
        if (parsed && std::isfinite(value))
          return std::string("must be ") + (allow_zero ? "non-negative (>= 0)" : "positive (> 0)") +
                 ", got '" + text + "'";
        return std::string("must be a finite ") + (allow_zero ? "non-negative" : "positive") +
               " number, got '" + text + "'";
      },
      allow_zero ? "NON-NEGATIVE" : "POSITIVE");
}

CLI::Validator count_check(int64_t lowest, int64_t highest) {
  const std::string range =
      "an integer in [" + std::to_string(lowest) + ", " + std::to_string(highest) + "]";
  return CLI::Validator(
      [lowest, highest, range](std::string& text) -> std::string {
        int64_t value = 0;
        const bool parsed = CLI::detail::lexical_cast(text, value);
        if (parsed && value >= lowest && value <= highest) return "";
        return "expected " + range + ", got '" + text + "'";
      },
      "INT in [" + std::to_string(lowest) + ", " + std::to_string(highest) + "]");
}

CLI::Validator peak_check(double highest) {
  // 0 turns the utilisation off; a tiny positive peak would print a utilisation hundreds of
  // digits long, so a peak starts at a thousandth.
  return CLI::Validator(
      [highest](std::string& text) -> std::string {
        double value = 0.0;
        const bool parsed = CLI::detail::lexical_cast(text, value);
        if (parsed && (value == 0.0 || (value >= 1e-3 && value <= highest))) return "";
        return "expected 0 (off) or a number in [0.001, " + CLI::detail::to_string(highest) +
               "], got '" + text + "'";
      },
      "0 or [0.001, " + CLI::detail::to_string(highest) + "]");
}

CLI::Validator uint64_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        // CLI11 turns a value past 2^64 - 1 into 2^64 - 1 without a word: check the digits here.
        const bool digits =
            !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        errno = 0;
        if (digits) std::strtoull(text.c_str(), nullptr, 10);
        if (digits && errno != ERANGE) return "";
        return "'" + text + "' is out of range (an integer from 0 to 18446744073709551615)";
      },
      "UINT64");
}

CLI::Validator choice_check(const std::vector<std::string>& allowed) {
  const std::string list = config_schema::join(allowed, ", ");
  return CLI::Validator(
      [allowed, list](std::string& text) -> std::string {
        if (std::find(allowed.begin(), allowed.end(), text) != allowed.end()) return "";
        return "expected one of " + list + ", got '" + text + "'";
      },
      "{" + config_schema::join(allowed, ",") + "}");
}

void refuse_non_decimal_integers(CLI::App& app) {
  for (CLI::App* job : app.get_subcommands({}))
    for (CLI::Option* option : job->get_options()) {
      const std::string type = option->get_type_name();
      if (type.rfind("INT", 0) != 0 && type.rfind("UINT", 0) != 0) continue;
      option->check(CLI::Validator(
          [](std::string& text) -> std::string {
            const size_t first = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
            const std::string digits = text.substr(first);
            // Text that is no number at all is left to the conversion's "is not an integer".
            if (digits.empty() || !std::isdigit(static_cast<unsigned char>(digits[0]))) return "";
            const bool decimal = digits.find_first_not_of("0123456789") == std::string::npos &&
                                 (digits.size() == 1 || digits[0] != '0');
            if (decimal) return "";
            return "'" + text + "' is not a decimal integer (no leading zeros, 0x or exponents)";
          },
          ""));
    }
}

void refuse_empty_values(CLI::App& app, const std::vector<std::string>& free_text) {
  for (CLI::App* job : app.get_subcommands({}))
    for (CLI::Option* option : job->get_options()) {
      if (option->get_type_name().rfind("TEXT", 0) != 0) continue;
      const std::string name = option->get_name();
      if (std::find(free_text.begin(), free_text.end(), name) != free_text.end()) continue;
      const std::string description = option->get_description();
      option->check(CLI::Validator(
          [description](std::string& text) -> std::string {
            return text.empty() ? "must not be empty (" + description + ")" : "";
          },
          ""));
    }
}

}  // namespace ft

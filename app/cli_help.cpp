#include "app/cli_help.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "app/config_schema.h"
#include "core/check.h"

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

}  // namespace

std::string version_text() {
  return std::string("fusiontrain ") + FT_VERSION + " (commit " + FT_GIT_COMMIT + ")";
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

std::string unknown_argument_error(CLI::App& app, int argc, char** argv) {
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
    if (std::find(flags.begin(), flags.end(), word) != flags.end()) continue;
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

}  // namespace ft

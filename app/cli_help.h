// What the command line says beyond CLI11's own parsing: the closest job or flag for a typo, the
// presets and where the config reference is in every --help, and a missing --config file named
// with the presets and the closest one. Used by app/main.cpp only.
// Thread safety: run from main() before anything else starts.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace ft {

// "fusiontrain <version> (commit <hash>)".
std::string version_text();

// Adds the footer (presets, config reference) to `app` and every job, and shows defaults in help.
void describe_jobs(CLI::App& app);

// An error message for the first unknown job or flag in argv, with the closest valid name; ""
// when argv names a known job and only its flags. REQUIRES: every job is added to `app`.
std::string unknown_argument_error(CLI::App& app, int argc, char** argv);

// Throws ft::Error when `path` does not exist: names it, the closest preset in configs/ and all of
// them. An empty path passes (jobs that default to a checkpoint's config).
void require_config_file(const std::string& path);

}  // namespace ft

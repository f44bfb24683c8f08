// What the command line says beyond CLI11's own parsing: the closest job or flag for a typo, the
// presets and where the config reference is in every --help, a missing --config file named with
// the presets and the closest one, the validators every job's flags share, and CLI11's parse
// errors in the project's "error: ..." form. Used by app/cli/main.cpp only.
// Thread safety: run from main() before anything else starts.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace ft {

// "fusiontrain <version> (commit <hash>)".
std::string version_text();

// Adds the footer (presets, config reference) to `app` and every job, and shows defaults in help.
void describe_jobs(CLI::App& app);

// An error message for the first unknown job or flag in argv, with the closest valid name (for a
// flag named like a config key's last part, `--steps 10`, that key's `--set train.steps=10`), or
// for a `--set key value` missing its '='; "" when argv names a known job and only its flags.
// `job` gets the job of an unknown flag, for its --help. REQUIRES: every job is added to `app`.
std::string unknown_argument_error(CLI::App& app, int argc, char** argv, std::string* job);

// Throws ft::Error when `path` does not exist: names it, the closest preset in configs/ and all of
// them. An empty path passes (jobs that default to a checkpoint's config).
void require_config_file(const std::string& path);

// The exit status of every usage error: an unknown job or flag, a value CLI11 refuses.
inline constexpr int kUsageErrorExit = 2;

// Prints "error: <message> (run 'fusiontrain <job> --help')" on stderr, `job` empty for the top
// level, and returns kUsageErrorExit.
int usage_error(const std::string& message, const std::string& job);

// Prints a CLI11 parse error as usage_error does, "Could not convert: --batch = abc" reworded as
// "--batch: 'abc' is not an integer", and returns kUsageErrorExit; --help and --version print as
// CLI11 prints them and return 0.
int report_parse_error(CLI::App& app, const CLI::ParseError& error);

// A number >= 0 (allow_zero) or > 0, and finite; says what is allowed in words.
CLI::Validator number_check(bool allow_zero);
// An integer count in [lowest, highest]: a job's length is bounded like a config key's range.
CLI::Validator count_check(int64_t lowest, int64_t highest);
// 0 (off) or a peak rate in [0.001, highest], for utilisation columns.
CLI::Validator peak_check(double highest);
// A decimal integer in [0, 2^64 - 1]: CLI11 would saturate a larger one in silence.
CLI::Validator uint64_check();
// One of `allowed`, exactly: "--dtype: expected one of fp32, bf16, got 'fp16'".
CLI::Validator choice_check(const std::vector<std::string>& allowed);

// Refuses an empty value for every text flag of every job except `free_text` ("--prompt"): a
// path, list or choice given as '' would otherwise fall back to its default, or to nothing.
void refuse_empty_values(CLI::App& app, const std::vector<std::string>& free_text);
// Adds a check to every integer option of every job: plain decimal digits, optionally signed.
// CLI11 reads integers in base 0, so "010" would silently be 8 and "0x10" 16.
void refuse_non_decimal_integers(CLI::App& app);

}  // namespace ft

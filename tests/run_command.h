// Runs a shell command or the fusiontrain binary for the CLI-level tests, capturing stdout and
// stderr together, with a hard timeout so a hang fails instead of stalling CI.
// Thread safety: popen per call; tests run it from one thread.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace ft::test {

struct RunResult {
  int exit_code = -1;
  std::string output;
};

inline RunResult run_shell(const std::string& command) {
  RunResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer;
  size_t got;
  while ((got = fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    result.output.append(buffer.data(), got);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

// `prefix fusiontrain args` from the source directory, killed after `timeout_s` seconds.
inline RunResult run_fusiontrain(const std::string& args, int timeout_s,
                                 const std::string& prefix = "") {
  return run_shell(std::string("cd ") + FT_SOURCE_DIR + " && timeout " + std::to_string(timeout_s) +
                   " " + prefix + FT_BINARY + " " + args);
}

}  // namespace ft::test

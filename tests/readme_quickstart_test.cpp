// Runs every command of README.md's "## Quick start" section, shortened, so that the commands a
// new user copies keep working. A command is a line (or `\`-continued lines) of a ```sh block
// under that heading; they run in order, from the source root, each under a 300 s timeout, and
// must exit 0.
//
// How a command is adapted before it runs (nothing else is changed):
//   - `build/fusiontrain` becomes the binary under test (FT_BINARY);
//   - `/tmp/ft/` becomes a fresh scratch folder, removed afterwards;
//   - `train.steps=N` becomes `train.steps=2`, and every checkpoint path's
//     `step_NNNNNN.safetensors` becomes `step_000002.safetensors`;
//   - `train` gets `--set train.steps=2`, `--set optim.warmup_steps=1` and a scratch
//     `--set train.run_dir=...`, each where it does not set that key, and
//     `--set data.test_limit=64` when its config is a ResNet (resnet8.yaml sets a warmup of 20,
//     which a 2-step run refuses);
//   - `bench` gets `--steps 2 --warmup 1`, `infer` gets `--limit 64`, `sample` gets
//     `--max-new-tokens 16` (appended at the end of the line, where later flags win);
//   - `scripts/load_export.py`: `--count N` becomes `--count 16`, and `--text FILE` reads the
//     first 16 KiB of FILE; where /usr/bin/python3 cannot import torch these commands are not
//     run and the test ends as skipped, after running all the others.
// So a README command must end with the job's own flags: no pipes, redirections or trailing
// comments.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/run_command.h"

namespace ft {
namespace {

constexpr int kShortSteps = 2;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The commands of the ```sh blocks between "## Quick start" and the next "## " heading.
std::vector<std::string> quick_start_commands(const std::string& readme) {
  std::vector<std::string> commands;
  std::istringstream lines(readme);
  std::string line, pending;
  bool in_section = false, in_block = false;
  while (std::getline(lines, line)) {
    if (!in_block && line.rfind("## ", 0) == 0) {
      in_section = line == "## Quick start";
      continue;
    }
    if (!in_section) continue;
    if (line.rfind("```", 0) == 0) {
      in_block = !in_block && line == "```sh";
      continue;
    }
    if (!in_block) continue;
    if (!line.empty() && line.back() == '\\') {
      pending += line.substr(0, line.size() - 1);
      continue;
    }
    line = pending + line;
    pending.clear();
    if (line.find_first_not_of(' ') == std::string::npos || line[0] == '#') continue;
    commands.push_back(line);
  }
  return commands;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

// The job a fusiontrain command runs: the word after the binary.
std::string job_of(const std::string& command) {
  std::smatch match;
  static const std::regex job(R"(build/fusiontrain\s+(\w+))");
  return std::regex_search(command, match, job) ? match[1].str() : "";
}

class ReadmeQuickstart : public ::testing::Test {
 protected:
  void SetUp() override {
    char scratch_template[] = "/tmp/ft_quickstart_XXXXXX";
    ASSERT_NE(mkdtemp(scratch_template), nullptr);
    scratch_ = scratch_template;
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(scratch_, ignored);
  }

  // The command as the test runs it (see the file comment).
  std::string adapt(std::string command, int index) {
    const std::string job = job_of(command);
    std::smatch match;
    char checkpoint[32];
    snprintf(checkpoint, sizeof checkpoint, "step_%06d.safetensors", kShortSteps);
    command = std::regex_replace(command, std::regex(R"(step_\d{6}\.safetensors)"), checkpoint);
    command = std::regex_replace(command, std::regex(R"(train\.steps=\d+)"),
                                 "train.steps=" + std::to_string(kShortSteps));
    if (job == "train") {
      if (command.find("train.steps=") == std::string::npos)
        command += " --set train.steps=" + std::to_string(kShortSteps);
      if (command.find("optim.warmup_steps=") == std::string::npos)
        command += " --set optim.warmup_steps=1";
      if (command.find("train.run_dir=") == std::string::npos)
        command += " --set train.run_dir=" + scratch_ + "/run" + std::to_string(index);
      if (command.find("resnet") != std::string::npos) command += " --set data.test_limit=64";
    } else if (job == "bench") {
      command += " --steps 2 --warmup 1";
    } else if (job == "infer") {
      command += " --limit 64";
    } else if (job == "sample") {
      command += " --max-new-tokens 16";
    }
    if (command.find("scripts/load_export.py") != std::string::npos) {
      command = std::regex_replace(command, std::regex(R"(--count \d+)"), "--count 16");
      static const std::regex text(R"(--text (\S+))");
      if (std::regex_search(command, match, text)) {
        const std::string excerpt = scratch_ + "/text" + std::to_string(index) + ".txt";
        std::ifstream in(std::string(FT_SOURCE_DIR) + "/" + match[1].str(), std::ios::binary);
        std::string head(16384, '\0');
        in.read(head.data(), static_cast<std::streamsize>(head.size()));
        head.resize(static_cast<size_t>(in.gcount()));
        std::ofstream(excerpt, std::ios::binary) << head;
        command = std::regex_replace(command, text, "--text " + excerpt);
      }
    }
    command = replace_all(command, "/tmp/ft/", scratch_ + "/");
    return replace_all(command, "build/fusiontrain", FT_BINARY);
  }

  std::string scratch_;
};

TEST_F(ReadmeQuickstart, EveryCommandRuns) {
  const std::vector<std::string> commands =
      quick_start_commands(read_file(std::string(FT_SOURCE_DIR) + "/README.md"));
  ASSERT_FALSE(commands.empty()) << "README.md has no ```sh block under '## Quick start'";

  // What users come for must stay in the section: training (also under mpirun), bench's
  // fused-against-unfused comparison, and export + infer + both forms of load_export.py.
  std::string all;
  for (const auto& command : commands) all += command + "\n";
  for (const char* needed :
       {"build/fusiontrain train", "mpirun", "build/fusiontrain bench", "--variants unfused,all",
        "build/fusiontrain export", "build/fusiontrain infer", "load_export.py --export", "--count",
        "--text"})
    EXPECT_NE(all.find(needed), std::string::npos) << "the quick start lost '" << needed << "'";

  const bool have_torch =
      test::run_shell("/usr/bin/python3 -c 'import numpy, torch'").exit_code == 0;
  std::vector<std::string> not_run;
  for (size_t i = 0; i < commands.size(); ++i) {
    if (!have_torch && commands[i].find("load_export.py") != std::string::npos) {
      not_run.push_back(commands[i]);
      continue;
    }
    const std::string command = adapt(commands[i], static_cast<int>(i));
    std::printf("[ quickstart ] %s\n", command.c_str());
    std::fflush(stdout);
    const test::RunResult run =
        test::run_shell(std::string("cd ") + FT_SOURCE_DIR + " && timeout 300 " + "sh -c '" +
                        replace_all(command, "'", "'\\''") + "'");
    EXPECT_EQ(run.exit_code, 0) << "README quick start command " << i + 1 << ":\n  " << commands[i]
                                << "\nran as:\n  " << command << "\noutput:\n"
                                << run.output;
  }
  if (!not_run.empty())
    GTEST_SKIP() << not_run.size() << " load_export.py command(s) not run: /usr/bin/python3 "
                 << "cannot import numpy and torch (install python3-torch)";
}

}  // namespace
}  // namespace ft

// The command line's own errors and help (app/cli/cli_help.h): a mistyped job or flag names the
// closest valid one, --version names the commit, --help lists the presets and where every config
// key is documented, and a missing --config file names the closest preset.
#include <gtest/gtest.h>

#include <string>

#include "tests/run_command.h"

namespace ft {
namespace {

using test::run_fusiontrain;

TEST(CliHelp, UnknownJobSuggestsTheClosest) {
  const test::RunResult result = run_fusiontrain("trian", 30);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("unknown job 'trian' (did you mean 'train'?)"), std::string::npos)
      << result.output;
}

TEST(CliHelp, UnknownFlagSuggestsTheClosest) {
  const test::RunResult result = run_fusiontrain("train --conifg configs/gpt_tiny.yaml", 30);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("unknown flag '--conifg' for train (did you mean '--config'?)"),
            std::string::npos)
      << result.output;
  const test::RunResult infer = run_fusiontrain("infer --modle x.safetensors", 30);
  EXPECT_NE(infer.output.find("did you mean '--model'?"), std::string::npos) << infer.output;
}

TEST(CliHelp, VersionNamesTheCommit) {
  const test::RunResult result = run_fusiontrain("--version", 30);
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_NE(result.output.find("fusiontrain "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("(commit "), std::string::npos) << result.output;
#if defined(FT_HAVE_CUDA)
  // The libraries this process loaded, one line each; no driver here, and the build's own.
  for (const char* line :
       {"\nCUDA runtime 1", "\nCUDA driver ", "\ncuBLASLt 1", "\ncuDNN 9.", "\nNCCL 2."})
    EXPECT_NE(result.output.find(line), std::string::npos) << line << " in " << result.output;
#else
  EXPECT_NE(result.output.find("\nCUDA path: not built"), std::string::npos) << result.output;
#endif
}

TEST(CliHelp, JobHelpShowsDefaultsPresetsAndTheReference) {
  const test::RunResult result = run_fusiontrain("infer --help", 30);
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_NE(result.output.find("=256"), std::string::npos) << result.output;  // --batch default
  EXPECT_NE(result.output.find("configs/resnet8.yaml"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("docs/config_reference.md"), std::string::npos) << result.output;
}

TEST(CliHelp, MissingConfigNamesTheClosestPreset) {
  const test::RunResult result = run_fusiontrain("plan --config configs/gpt_tin.yaml", 30);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.output.find("did you mean 'configs/gpt_tiny.yaml'?"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("presets: "), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find(".cpp:"), std::string::npos) << result.output;
}

// Every job's --json output fails loudly on a full disk (/dev/full refuses every write).
TEST(CliHelp, JsonOnAFullDiskFailsLoudly) {
  const test::RunResult plan =
      run_fusiontrain("plan --config configs/resnet8.yaml --batch 2 --json /dev/full", 60);
  EXPECT_EQ(plan.exit_code, 1) << plan.output;
  EXPECT_NE(plan.output.find("cannot write '/dev/full': No space left on device"),
            std::string::npos)
      << plan.output;
}

// A budget too small for tune's first measurement says so instead of exiting 1 in silence.
TEST(CliHelp, TuneBudgetTooSmallSaysSo) {
  const test::RunResult result = run_fusiontrain("tune --budget-steps 1", 60);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--budget-steps 1 cannot pay for the first measurement"),
            std::string::npos)
      << result.output;
}

}  // namespace
}  // namespace ft

// Relative data paths: a config's data.path is found from the working directory or, failing that,
// from the config file's folder and those above it, so a checkout's config runs from anywhere; a
// path found nowhere is an error that says where it looked, with the bootstrap hint only for the
// project's own corpus.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "app/config/config.h"
#include "tests/guard_test_util.h"

namespace ft {
namespace {

using namespace guard_test;

TEST(DataPath, RelativePathIsFoundFromTheConfigsCheckout) {
  const std::string config = std::string(FT_SOURCE_DIR) + "/configs/gpt_tiny.yaml";
  const std::string dir = fresh_dir("elsewhere");
  const std::filesystem::path started_in = std::filesystem::current_path();
  std::filesystem::current_path(dir);  // where data/ is not
  EXPECT_EQ(find_data_file("data/moby_dick.txt", config),
            std::string(FT_SOURCE_DIR) + "/data/moby_dick.txt");
  EXPECT_EQ(find_data_file("data/no_such.txt", config), "data/no_such.txt");
  EXPECT_EQ(find_data_file("/abs/no_such.txt", config), "/abs/no_such.txt");
  std::filesystem::current_path(started_in);
  // Trained from another folder: found, and the run's config.yaml keeps the absolute path.
  const RunResult run = test::run_shell("cd " + dir + " && timeout 60 " + FT_BINARY + " " +
                                        tiny_train(dir, "--set train.steps=1", config));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::ifstream written(dir + "/config.yaml");
  const std::string text((std::istreambuf_iterator<char>(written)), {});
  EXPECT_TRUE(contains(text, std::string(FT_SOURCE_DIR) + "/data/moby_dick.txt")) << text;
}

TEST(DataPath, MissingPathSaysWhereItLookedAndHintsBootstrapOnlyForOurCorpus) {
  const std::string dir = fresh_dir("missing");
  const std::string config = std::string(FT_SOURCE_DIR) + "/configs/gpt_tiny.yaml";
  const RunResult mine =
      test::run_shell("cd " + dir + " && timeout 60 " + FT_BINARY + " " +
                      tiny_train(dir, "--set data.path=mine/corpus.txt", config));
  EXPECT_EQ(mine.exit_code, 1) << mine.output;
  EXPECT_TRUE(contains(mine.output, "text data file mine/corpus.txt: cannot open")) << mine.output;
  EXPECT_TRUE(contains(mine.output, "looked up from the working directory (" +
                                        std::filesystem::canonical(dir).string() + ")"))
      << mine.output;
  EXPECT_FALSE(contains(mine.output, "bootstrap")) << mine.output;
  const RunResult ours =
      test::run_shell("cd " + dir + " && timeout 60 " + FT_BINARY + " " +
                      tiny_train(dir, "--set data.path=/nowhere/moby_dick.txt", config));
  EXPECT_EQ(ours.exit_code, 1) << ours.output;
  EXPECT_TRUE(contains(ours.output, "run scripts/bootstrap.sh to fetch the corpus")) << ours.output;
}

}  // namespace
}  // namespace ft

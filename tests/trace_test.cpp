// Timeline trace on one process (app/training/trace.h): `fusiontrain train` with train.trace writes
// valid Chrome trace-event JSON of the window's steps, every slice nests in its step, ops of one
// track never overlap, and every op of the executed graph appears once forward and once backward in
// each traced step, in graph order and reverse graph order.
#include "app/training/trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "app/jobs/jobs.h"
#include "app/training/trainer.h"
#include "tests/trace_test_util.h"

namespace ft {
namespace {

std::string source_path(const std::string& relative) {
  return std::string(FT_SOURCE_DIR) + "/" + relative;
}

std::vector<std::string> tiny_overrides(const std::string& dir, int steps) {
  return {"data.path=" + source_path("data/moby_dick.txt"),
          "model.n_layer=1",
          "model.n_head=2",
          "model.d_model=32",
          "model.seq_len=16",
          "train.batch_size=2",
          "optim.warmup_steps=1",
          "train.threads=1",
          "train.steps=" + std::to_string(steps),
          "train.eval_every=0",
          "train.eval_batches=1",
          "train.run_dir=" + dir,
          "train.checkpoint_dir=" + dir + "/checkpoints",
          "train.trace=" + dir + "/trace.json"};
}

class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One folder per process: ctest runs the cases as parallel processes, and gtest's random
    // seed (the time in ms) named two of them alike once.
    dir_ = (std::filesystem::temp_directory_path() /
            ("ft_trace_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST(TraceWindowTest, StepsFourToSixOrTheLastThree) {
  EXPECT_EQ(trace_window(0, 10).first, 4);
  EXPECT_EQ(trace_window(0, 10).last, 6);
  EXPECT_EQ(trace_window(0, 6).first, 4);
  EXPECT_EQ(trace_window(0, 5).first, 3);
  EXPECT_EQ(trace_window(0, 5).last, 5);
  EXPECT_EQ(trace_window(0, 2).first, 1);
  EXPECT_EQ(trace_window(0, 2).last, 2);
  EXPECT_FALSE(trace_window(0, 0).contains(1));
  // A resumed run counts from where it starts.
  EXPECT_EQ(trace_window(100, 110).first, 104);
  EXPECT_EQ(trace_window(100, 110).last, 106);
}

TEST_F(TraceTest, TrainWritesNestedOpsOfEveryTracedStep) {
  const std::vector<std::string> overrides = tiny_overrides(dir_, 7);
  TrainArgs args;
  args.config_path = source_path("configs/gpt_tiny.yaml");
  args.overrides = overrides;
  ASSERT_EQ(run_train(args, nullptr), 0);

  const nlohmann::json trace = load_trace(dir_ + "/trace.json");
  EXPECT_EQ(trace.at("otherData").at("first_step").get<int>(), 4);
  EXPECT_EQ(trace.at("otherData").at("last_step").get<int>(), 6);
  const SlicesByTrack tracks = load_slices(trace);
  ASSERT_EQ(tracks.size(), 1u);
  ASSERT_TRUE(tracks.count(0));
  expect_well_formed(tracks, 4, 6);
  EXPECT_FALSE(tracks.at(0).count(kCommTid)) << "one process reduces nothing";

  // The executed graph of the same config (fusion passes applied), built again here.
  Trainer trainer(load_config(args.config_path, overrides), nullptr);
  const std::vector<std::unique_ptr<Op>>& ops = trainer.executor().graph().ops;
  ASSERT_FALSE(ops.empty());
  for (int step = 4; step <= 6; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<Slice> slices = in_step(tracks.at(0).at(kComputeTid), step);
    std::vector<std::string> forward, backward;
    for (const Slice& slice : slices) {
      ASSERT_TRUE(slice.cat == "forward" || slice.cat == "backward") << slice.cat;
      EXPECT_EQ(slice.args.at("kind").get<std::string>(),
                std::string(ops[slice.args.at("op_index").get<int>()]->kind()));
      (slice.cat == "forward" ? forward : backward).push_back(slice.name);
    }
    ASSERT_EQ(forward.size(), ops.size());
    ASSERT_EQ(backward.size(), ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      EXPECT_EQ(forward[i], ops[i]->name);
      EXPECT_EQ(backward[i], ops[ops.size() - 1 - i]->name);
    }
    // Backward follows forward.
    EXPECT_GE(slices.back().ts, slices.front().end());
    EXPECT_EQ(slices.front().cat, "forward");
    EXPECT_EQ(slices.back().cat, "backward");
  }
}

TEST_F(TraceTest, ShortRunTracesItsLastSteps) {
  TrainArgs args;
  args.config_path = source_path("configs/gpt_tiny.yaml");
  args.overrides = tiny_overrides(dir_, 2);
  ASSERT_EQ(run_train(args, nullptr), 0);
  const SlicesByTrack tracks = load_slices(load_trace(dir_ + "/trace.json"));
  expect_well_formed(tracks, 1, 2);
}

TEST_F(TraceTest, NoFileWithoutTheKey) {
  TrainArgs args;
  args.config_path = source_path("configs/gpt_tiny.yaml");
  args.overrides = tiny_overrides(dir_, 4);
  args.overrides.back() = "train.trace=";
  ASSERT_EQ(run_train(args, nullptr), 0);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/trace.json"));
}

}  // namespace
}  // namespace ft

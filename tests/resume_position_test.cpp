// Resume restores each rank's data position from the checkpoint in O(1): a task's data_state()
// put into a fresh task gives the batches that would have followed (GPT and ResNet); a checkpoint
// at step 2,000,000,000 resumes at once (it once replayed every batch, about 13 minutes); one
// without a data state (an older checkpoint) replays a bounded number of batches, and refuses
// more, naming the file. Bit-exact resume itself is Resume.* in tests/train_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/training/task.h"
#include "app/training/trainer.h"
#include "core/check.h"
#include "core/safetensors.h"

namespace ft {
namespace {

std::string source_path(const std::string& relative) {
  return std::string(FT_SOURCE_DIR) + "/" + relative;
}

Config config_of(const std::string& preset, std::vector<std::string> overrides) {
  overrides.push_back("train.threads=1");
  if (preset == "gpt_tiny") overrides.push_back("data.path=" + source_path("data/moby_dick.txt"));
  return load_config(source_path("configs/" + preset + ".yaml"), overrides);
}

// The inputs of the next training batch: tokens (GPT) or pixels (ResNet), as floats.
std::vector<float> next_inputs(Task& task, const Config& config) {
  ParamStore params;
  task.register_params(params);
  params.allocate();
  const Graph graph = task.build_graph(config.train.batch_size, GraphMode::kTrain);
  Executor executor(graph, params);
  Workspace ws = executor.make_workspace();
  task.next_train_batch(ws, graph);
  if (!ws.tokens.empty()) return std::vector<float>(ws.tokens.begin(), ws.tokens.end());
  return ws.values[graph.input].to_host_vector();
}

TEST(ResumePosition, DataStateGivesTheBatchesThatFollow) {
  for (const std::string preset : {"gpt_tiny", "resnet8"}) {
    SCOPED_TRACE(preset);
    const Config config = config_of(preset, {"train.batch_size=4"});
    std::unique_ptr<Task> replayed = make_task(config, 0, 1);
    replayed->skip_train_batches(37);
    std::unique_ptr<Task> restored = make_task(config, 0, 1);
    restored->set_data_state(replayed->data_state(), "test");
    EXPECT_EQ(restored->data_state(), replayed->data_state());
    EXPECT_EQ(next_inputs(*restored, config), next_inputs(*replayed, config));
    EXPECT_THROW(restored->set_data_state("1 2 3", "test"), Error);
    EXPECT_THROW(restored->set_data_state("1 2 3 4 5 6", "test"), Error);
  }
}

class ResumeAtAHugeStep : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/resume_position_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    Trainer trainer(config_of("gpt_tiny", {"train.steps=3"}), nullptr);
    trainer.train_step();
    trainer.save_checkpoint(dir_ + "/step1.safetensors");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The checkpoint with its step set to 2e9 (and its data state kept or dropped).
  std::string at_huge_step(bool keep_data_state) {
    SafetensorsFile file = load_safetensors(dir_ + "/step1.safetensors");
    file.metadata["step"] = "2000000000";
    file.metadata["optimizer_steps"] = "2000000000";
    if (!keep_data_state) file.metadata.erase("data_state");
    const std::string path = dir_ + (keep_data_state ? "/huge.safetensors" : "/old.safetensors");
    save_safetensors(path, file);
    return path;
  }
  Config resume_from(const std::string& path) {
    return config_of("gpt_tiny", {"train.steps=2000000001", "train.resume=" + path});
  }

  std::string dir_;
};

TEST_F(ResumeAtAHugeStep, RestoresTheStoredPositionAndTrains) {
  const std::string huge = at_huge_step(true);
  const std::string stored = nlohmann::json::parse(load_safetensors(huge).metadata.at("data_state"))
                                 .at(0)
                                 .get<std::string>();
  Trainer trainer(resume_from(huge), nullptr);
  EXPECT_EQ(trainer.step(), 2000000000);
  // The stored position itself, not one replayed from the step (which would take minutes).
  EXPECT_EQ(trainer.task().data_state(), stored);
  EXPECT_TRUE(std::isfinite(trainer.train_step().loss));
}

TEST_F(ResumeAtAHugeStep, WithoutADataStateAReplayIsBoundedAndRefusedBeyond) {
  const std::string old = at_huge_step(false);
  try {
    Trainer trainer(resume_from(old), nullptr);
    FAIL() << "a 2e9-batch replay was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(old + ": the checkpoint holds no data position"),
              std::string::npos)
        << error.what();
  }
  // A small step without a data state still resumes, by replay.
  SafetensorsFile file = load_safetensors(dir_ + "/step1.safetensors");
  file.metadata.erase("data_state");
  save_safetensors(dir_ + "/old_small.safetensors", file);
  Trainer trainer(
      config_of("gpt_tiny", {"train.steps=3", "train.resume=" + dir_ + "/old_small.safetensors"}),
      nullptr);
  EXPECT_EQ(trainer.step(), 1);
}

}  // namespace
}  // namespace ft

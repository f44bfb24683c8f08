// Tests for fusion/multi_tensor_launch.h, the kernel-argument tables of the CUDA multi-tensor
// passes, on the CPU: a host emulation runs every block of every launch through
// multi_tensor_block_range (the function the kernels call) and counts the floats each array
// receives, so "every float exactly once" is checked for the real addressing; and the tables'
// limits, carry-over of split tensors, empty tensors, flags and block numbering.
#include "fusion/multi_tensor_launch.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "core/check.h"

namespace ft {
namespace {

// Owns Depth float arrays per tensor, each zero, and the packer's input list over them.
template <int Depth>
struct TensorList {
  std::vector<std::vector<float>> arrays;  // [tensor * Depth + d]
  std::vector<MultiTensorInput<Depth>> inputs;

  void add(int64_t numel, bool weight_decay) {
    MultiTensorInput<Depth> input;
    for (int d = 0; d < Depth; ++d) {
      arrays.emplace_back(static_cast<size_t>(numel), 0.0f);
      input.addresses[d] = arrays.back().data();
    }
    input.numel = numel;
    input.weight_decay = weight_decay;
    inputs.push_back(input);
  }
  // Addresses change when `arrays` reallocates: call after the last add().
  void rebind() {
    for (size_t t = 0; t < inputs.size(); ++t)
      for (int d = 0; d < Depth; ++d) inputs[t].addresses[d] = arrays[t * Depth + d].data();
  }
};

// The kernels' view: block b of a launch adds d + 1 to each float of its range in array d, and
// records which input a block's slot is (found by its first address).
template <int Depth>
void run_blocks(const std::vector<MultiTensorLaunch<Depth>>& launches, TensorList<Depth>& list) {
  std::map<const float*, size_t> input_of;
  for (size_t t = 0; t < list.inputs.size(); ++t) input_of[list.inputs[t].addresses[0]] = t;
  for (const MultiTensorLaunch<Depth>& launch : launches)
    for (int b = 0; b < launch.num_blocks; ++b) {
      const MultiTensorBlockRange range = multi_tensor_block_range(launch, b);
      ASSERT_LT(range.tensor, launch.num_tensors);
      const auto found = input_of.find(launch.addresses[0][range.tensor]);
      ASSERT_NE(found, input_of.end()) << "block " << b << " has an unknown tensor";
      const MultiTensorInput<Depth>& input = list.inputs[found->second];
      EXPECT_EQ(launch.numel[range.tensor], input.numel);
      EXPECT_EQ(launch.weight_decay[range.tensor] != 0, input.weight_decay);
      for (int d = 0; d < Depth; ++d)
        ASSERT_EQ(launch.addresses[d][range.tensor], input.addresses[d]) << "array " << d;
      ASSERT_GE(range.begin, 0);
      ASSERT_GT(range.count, 0) << "a block with nothing to do";
      ASSERT_LE(range.begin + range.count, input.numel);
      for (int d = 0; d < Depth; ++d)
        for (int64_t i = range.begin; i < range.begin + range.count; ++i)
          launch.addresses[d][range.tensor][i] += static_cast<float>(d + 1);
    }
}

template <int Depth>
void expect_each_float_once(const TensorList<Depth>& list) {
  for (size_t a = 0; a < list.arrays.size(); ++a) {
    const float expected = static_cast<float>(a % Depth + 1);
    int64_t wrong = 0;
    for (float x : list.arrays[a]) wrong += x != expected;
    EXPECT_EQ(wrong, 0) << "tensor " << a / Depth << " array " << a % Depth << " of "
                        << list.arrays[a].size() << " floats";
  }
}

template <int Depth>
void expect_tables_within_limits(const std::vector<MultiTensorLaunch<Depth>>& launches) {
  int64_t blocks_before = 0;
  for (const MultiTensorLaunch<Depth>& launch : launches) {
    EXPECT_GT(launch.num_blocks, 0);
    EXPECT_LE(launch.num_blocks, MultiTensorLaunch<Depth>::kMaxBlocks);
    EXPECT_GT(launch.num_tensors, 0);
    EXPECT_LE(launch.num_tensors, MultiTensorLaunch<Depth>::kMaxTensors);
    EXPECT_EQ(launch.first_block, blocks_before);
    blocks_before += launch.num_blocks;
  }
  EXPECT_EQ(multi_tensor_block_count(launches), blocks_before);
}

TEST(MultiTensorLaunchTest, TablesFitTheKernelParameterLimit) {
  EXPECT_LE(sizeof(MultiTensorLaunch<1>) + sizeof(AdamWStep) + sizeof(double*), 4096u);
  EXPECT_LE(sizeof(MultiTensorLaunch<4>) + sizeof(AdamWStep), 4096u);
  EXPECT_EQ(MultiTensorLaunch<1>::kMaxTensors, 130);
  EXPECT_EQ(MultiTensorLaunch<3>::kMaxTensors, 67);
  EXPECT_EQ(MultiTensorLaunch<4>::kMaxTensors, 54);
  EXPECT_EQ(MultiTensorLaunch<4>::kMaxBlocks, 320);
}

TEST(MultiTensorLaunchTest, EveryFloatOfMixedSizesIsCoveredOnceAtEveryDepth) {
  TensorList<4> list;
  for (int64_t numel : {int64_t{1}, kSweepChunk - 1, kSweepChunk, kSweepChunk + 1, int64_t{3},
                        3 * kSweepChunk + 17, int64_t{0}, int64_t{768}})
    list.add(numel, numel % 2 == 0);
  list.rebind();
  const auto launches = pack_multi_tensor_launches(list.inputs);
  ASSERT_EQ(launches.size(), 1u);
  // Chunks: 1 + 1 + 1 + 2 + 1 + 4 + 0 + 1.
  EXPECT_EQ(launches[0].num_blocks, 11);
  EXPECT_EQ(launches[0].num_tensors, 7) << "the empty tensor takes no slot";
  expect_tables_within_limits(launches);
  run_blocks(launches, list);
  expect_each_float_once(list);
}

TEST(MultiTensorLaunchTest, ChunksStartAtChunkMultiplesAndOnlyTheLastIsShort) {
  TensorList<1> list;
  list.add(2 * kSweepChunk + 5, true);
  list.add(kSweepChunk, false);
  list.rebind();
  const auto launches = pack_multi_tensor_launches(list.inputs);
  ASSERT_EQ(launches.size(), 1u);
  const std::vector<std::pair<int64_t, int64_t>> expected = {
      {0, kSweepChunk}, {kSweepChunk, kSweepChunk}, {2 * kSweepChunk, 5}, {0, kSweepChunk}};
  ASSERT_EQ(launches[0].num_blocks, static_cast<int>(expected.size()));
  for (int b = 0; b < launches[0].num_blocks; ++b) {
    const MultiTensorBlockRange range = multi_tensor_block_range(launches[0], b);
    EXPECT_EQ(range.tensor, b < 3 ? 0 : 1) << b;
    EXPECT_EQ(range.begin, expected[b].first) << b;
    EXPECT_EQ(range.count, expected[b].second) << b;
  }
  EXPECT_EQ(launches[0].chunk_size, kSweepChunk);
}

TEST(MultiTensorLaunchTest, ATensorWithMoreChunksThanATableContinuesInTheNextLaunch) {
  // Chunks of 4 floats: 2 + 701 + 3 blocks need three tables of 320 blocks.
  TensorList<3> list;
  list.add(5, false);
  list.add(4 * 700 + 1, true);
  list.add(9, false);
  list.rebind();
  const auto launches = pack_multi_tensor_launches(list.inputs, 4);
  ASSERT_EQ(launches.size(), 3u);
  EXPECT_EQ(launches[0].num_blocks, 320);
  EXPECT_EQ(launches[1].num_blocks, 320);
  EXPECT_EQ(launches[2].num_blocks, 2 + 701 + 3 - 640);
  EXPECT_EQ(launches[0].num_tensors, 2);
  EXPECT_EQ(launches[1].num_tensors, 1) << "the split tensor is entered again";
  EXPECT_EQ(launches[2].num_tensors, 2);
  // The continued tensor resumes at the chunk after the last one of the previous table.
  EXPECT_EQ(multi_tensor_block_range(launches[1], 0).begin, 4 * (320 - 2));
  expect_tables_within_limits(launches);
  run_blocks(launches, list);
  expect_each_float_once(list);
}

TEST(MultiTensorLaunchTest, ManySmallTensorsOverflowTheTensorTable) {
  TensorList<4> list;
  const int count = 3 * MultiTensorLaunch<4>::kMaxTensors + 7;
  for (int t = 0; t < count; ++t) list.add(1 + t % 5, t % 3 == 0);
  list.rebind();
  const auto launches = pack_multi_tensor_launches(list.inputs);
  ASSERT_EQ(launches.size(), 4u);
  for (int l = 0; l < 3; ++l) EXPECT_EQ(launches[l].num_tensors, MultiTensorLaunch<4>::kMaxTensors);
  EXPECT_EQ(launches[3].num_tensors, 7);
  expect_tables_within_limits(launches);
  run_blocks(launches, list);
  expect_each_float_once(list);
}

TEST(MultiTensorLaunchTest, BothTablesFillingAtOnceStartsAFreshLaunch) {
  // Chunk size 1: 129 one-float tensors and one of 191 floats fill both tables at once.
  TensorList<1> list;
  for (int t = 0; t < MultiTensorLaunch<1>::kMaxTensors; ++t) list.add(t < 129 ? 1 : 191, false);
  list.add(3, true);
  list.rebind();
  const auto launches = pack_multi_tensor_launches(list.inputs, 1);
  ASSERT_EQ(launches.size(), 2u);
  EXPECT_EQ(launches[0].num_blocks, 320);
  EXPECT_EQ(launches[0].num_tensors, 130);
  EXPECT_EQ(launches[1].num_tensors, 1);
  EXPECT_EQ(launches[1].num_blocks, 3);
  EXPECT_EQ(launches[1].weight_decay[0], 1);
  expect_tables_within_limits(launches);
  run_blocks(launches, list);
  expect_each_float_once(list);
}

TEST(MultiTensorLaunchTest, EmptyTensorsAreSkippedAndAnEmptyListGivesNoLaunch) {
  TensorList<2> empty;
  empty.add(0, true);
  empty.add(0, false);
  empty.rebind();
  EXPECT_TRUE(pack_multi_tensor_launches(empty.inputs).empty());
  EXPECT_TRUE(pack_multi_tensor_launches(std::vector<MultiTensorInput<2>>{}).empty());
  EXPECT_EQ(multi_tensor_block_count(std::vector<MultiTensorLaunch<2>>{}), 0);

  TensorList<2> list;
  list.add(0, true);
  list.add(10, false);
  list.add(0, true);
  list.add(20, true);
  list.rebind();
  const auto launches = pack_multi_tensor_launches(list.inputs, 8);
  ASSERT_EQ(launches.size(), 1u);
  EXPECT_EQ(launches[0].num_tensors, 2);
  EXPECT_EQ(launches[0].numel[0], 10);
  EXPECT_EQ(launches[0].numel[1], 20);
  EXPECT_EQ(launches[0].weight_decay[0], 0);
  EXPECT_EQ(launches[0].weight_decay[1], 1);
  run_blocks(launches, list);
  expect_each_float_once(list);
}

TEST(MultiTensorLaunchTest, RejectsANonPositiveChunkSize) {
  TensorList<1> list;
  list.add(4, false);
  list.rebind();
  EXPECT_THROW(pack_multi_tensor_launches(list.inputs, 0), Error);
}

}  // namespace
}  // namespace ft

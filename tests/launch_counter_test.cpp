// core/launch_counter.h: each count_launch adds one to its own kind only, snapshots subtract and
// add field by field, and counts from several threads are all kept (the comm thread counts its
// host-staged copies while the training thread counts kernels).
#include "core/launch_counter.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace ft {
namespace {

TEST(LaunchCounter, EachKindCountsOnItsOwn) {
  const LaunchCounts before = launch_counts();
  count_launch(LaunchKind::kKernel);
  count_launch(LaunchKind::kKernel);
  count_launch(LaunchKind::kGemm);
  count_launch(LaunchKind::kConvolution);
  count_launch(LaunchKind::kCopy);
  count_launch(LaunchKind::kCopy);
  count_launch(LaunchKind::kCopy);
  const LaunchCounts delta = launch_counts() - before;
  EXPECT_EQ(delta.kernels, 2);
  EXPECT_EQ(delta.gemms, 1);
  EXPECT_EQ(delta.convolutions, 1);
  EXPECT_EQ(delta.copies, 3);
  EXPECT_EQ(delta.total(), 7);

  LaunchCounts sum = delta;
  sum += delta;
  EXPECT_EQ(sum.kernels, 4);
  EXPECT_EQ(sum.copies, 6);
  EXPECT_EQ(sum.total(), 14);
}

TEST(LaunchCounter, KeepsEveryThreadsCounts) {
  const LaunchCounts before = launch_counts();
  constexpr int kThreads = 4, kPerThread = 10000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([] {
      for (int i = 0; i < kPerThread; ++i) count_launch(LaunchKind::kKernel);
    });
  for (std::thread& thread : threads) thread.join();
  const LaunchCounts delta = launch_counts() - before;
  EXPECT_EQ(delta.kernels, kThreads * kPerThread);
  EXPECT_EQ(delta.total(), kThreads * kPerThread);
}

}  // namespace
}  // namespace ft

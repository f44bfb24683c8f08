// The ordering logic of GradSync's device (NCCL) path, on the CPU, through a fake stream
// communicator: allreduce_async only records the launch (as NCCL enqueues on its stream after an
// event on the compute stream), and the sum lands in the buffer only when the handle's wait()
// runs (as the compute stream's wait on the done event). So the test sees that every bucket is
// launched during backward, the moment its last gradient is announced and in bucket order, that
// nothing is launched for an accumulation micro-batch, and that finish() waits for each bucket
// before scaling it: a scale before the wait would be overwritten by the late sum.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/grad_sync.h"
#include "fake_stream_communicator.h"

namespace ft {
namespace {

using test::FakeStreamCommunicator;
using test::HostRanks;

// Four parameters of 256 KiB each; buckets of 512 KiB (first 256 KiB) hold {p3}, {p2, p1}, {p0}
// in the default (reverse registration) ready order.
struct Model {
  Model() {
    for (int i = 0; i < 4; ++i)
      params.add("p" + std::to_string(i), {65536}, ParamInit::kZeros, 0.0f, true);
    params.allocate();
    for (ParamId id = 0; id < 4; ++id) params[id].grad.fill(static_cast<float>(id + 1));
  }
  ParamStore params;
  std::vector<ParamId> ready_order{3, 2, 1, 0};
};

GradSyncOptions bucket_options(bool bucket_view) {
  GradSyncOptions options;
  options.bucket_mb = 0.5;
  options.first_bucket_mb = 0.25;
  options.bucket_view = bucket_view;
  return options;
}

TEST(GradSyncStream, BucketsLaunchWhenCompleteAndFinishWaitsBeforeScaling) {
  for (bool bucket_view : {true, false}) {
    SCOPED_TRACE(bucket_view ? "bucket_view" : "fusion buffer");
    Model model;
    FakeStreamCommunicator comm(4);
    HostRanks host(4);
    GradSync sync(comm, model.params, model.ready_order, bucket_options(bucket_view), &host);
    EXPECT_TRUE(comm.events.empty()) << "the layout check went to the device communicator";
    ASSERT_EQ(sync.buckets().size(), 3u);
    sync.begin_backward(true);
    sync.on_grad_ready(3);
    EXPECT_EQ(comm.events, (std::vector<std::string>{"launch 65536"}));
    sync.on_grad_ready(2);
    EXPECT_EQ(comm.events.size(), 1u) << "bucket {p2, p1} launched before p1 was final";
    sync.on_grad_ready(1);
    EXPECT_EQ(comm.events.back(), "launch 131072");
    sync.on_grad_ready(0);
    EXPECT_EQ(comm.events.size(), 3u);
    sync.finish(0.25f);  // 4 ranks: the mean
    EXPECT_EQ(comm.events,
              (std::vector<std::string>{"launch 65536", "launch 131072", "launch 65536",
                                        "wait 65536", "wait 131072", "wait 65536"}));
    // sum over 4 identical ranks, then * 1/4: the local gradient again, exactly.
    for (ParamId id = 0; id < 4; ++id) {
      const float* grad = model.params[id].grad.data();
      EXPECT_EQ(grad[0], static_cast<float>(id + 1)) << model.params[id].name;
      EXPECT_EQ(grad[65535], static_cast<float>(id + 1)) << model.params[id].name;
    }
    EXPECT_EQ(sync.last_stats().allreduce_calls, 3);
  }
}

TEST(GradSyncStream, AccumulationMicroBatchesLaunchNothing) {
  Model model;
  FakeStreamCommunicator comm(2);
  HostRanks host(2);
  GradSync sync(comm, model.params, model.ready_order, bucket_options(true), &host);
  sync.begin_backward(false);
  for (ParamId id : model.ready_order) sync.on_grad_ready(id);
  sync.finish(1.0f);
  EXPECT_TRUE(comm.events.empty());
  sync.begin_backward(true);
  for (ParamId id : model.ready_order) sync.on_grad_ready(id);
  sync.finish(0.5f);
  EXPECT_EQ(comm.events.size(), 6u);  // three launches, three waits
  EXPECT_EQ(model.params[2].grad.data()[7], 3.0f);
}

TEST(GradSyncStream, UnannouncedParamsLaunchInFinishInBucketOrder) {
  Model model;
  FakeStreamCommunicator comm(2);
  HostRanks host(2);
  GradSync sync(comm, model.params, model.ready_order, bucket_options(true), &host);
  sync.begin_backward(true);
  sync.on_grad_ready(3);
  sync.finish(0.5f);  // p2, p1, p0 never announced: final now
  EXPECT_EQ(comm.events, (std::vector<std::string>{"launch 65536", "launch 131072", "launch 65536",
                                                   "wait 65536", "wait 131072", "wait 65536"}));
}

TEST(GradSyncStream, ReorderingAsksTheHostCommunicatorOnly) {
  Model model;
  FakeStreamCommunicator comm(2);
  HostRanks host(2);
  GradSyncOptions options = bucket_options(true);
  options.reorder_buckets = true;
  GradSync sync(comm, model.params, model.ready_order, options, &host);
  sync.begin_backward(true);
  for (ParamId id : {0, 1, 2, 3}) sync.on_grad_ready(id);  // not the default order
  sync.finish(0.5f);
  for (const std::string& event : comm.events)
    EXPECT_EQ(event.find("blocking"), std::string::npos) << event;
  EXPECT_EQ(sync.buckets().front().params.front(), 0) << "buckets not rebuilt in observed order";
}

// A one-GPU machine reaches the device path only with single_rank_allreduce: without it one rank
// launches nothing; with it every bucket is launched, waited for and scaled as on several ranks,
// for both bucket layouts (the fusion buffer's staging copies included).
TEST(GradSyncStream, OneRankLaunchesOnlyWhenAsked) {
  for (bool single_rank_allreduce : {false, true}) {
    for (bool bucket_view : {true, false}) {
      SCOPED_TRACE(std::string(single_rank_allreduce ? "asked" : "default") +
                   (bucket_view ? ", bucket_view" : ", fusion buffer"));
      Model model;
      FakeStreamCommunicator comm(1);
      HostRanks host(1);
      GradSyncOptions options = bucket_options(bucket_view);
      options.single_rank_allreduce = single_rank_allreduce;
      GradSync sync(comm, model.params, model.ready_order, options, &host);
      sync.begin_backward(true);
      for (ParamId id : model.ready_order) sync.on_grad_ready(id);
      sync.finish(0.5f);
      const std::vector<std::string> expected =
          single_rank_allreduce
              ? std::vector<std::string>{"launch 65536", "launch 131072", "launch 65536",
                                         "wait 65536",   "wait 131072",   "wait 65536"}
              : std::vector<std::string>{};
      EXPECT_EQ(comm.events, expected);
      EXPECT_EQ(sync.last_stats().allreduce_calls, single_rank_allreduce ? 3 : 0);
      EXPECT_EQ(sync.last_stats().extra_memory_bytes,
                single_rank_allreduce && !bucket_view ? 4 * 65536 * 4 : 0);
      // The one-rank sum is the gradient itself; the scale applies either way.
      for (ParamId id = 0; id < 4; ++id)
        EXPECT_EQ(model.params[id].grad.data()[100], 0.5f * static_cast<float>(id + 1));
    }
  }
}

}  // namespace
}  // namespace ft

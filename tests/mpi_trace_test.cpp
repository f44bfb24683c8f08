// Timeline trace on 2 and 3 ranks (app/training/trace.h): rank 0 writes one file holding every
// rank's events; every gradient bucket has a communication slice on every rank in every traced
// step; with comm.overlap on at least one bucket's allreduce starts under backward (before the
// step's last backward op ends), with it off every bucket starts after that op. ctest runs this
// under mpirun with 2 and 3 ranks.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "app/jobs/jobs.h"
#include "comm/mpi/mpi_communicator.h"
#include "tests/mpi_test_main.h"
#include "tests/trace_test_util.h"

namespace ft {
namespace {

constexpr int kFirstStep = 4, kLastStep = 6;

// A directory name every rank agrees on: rank 0's pid.
std::string shared_dir(const std::string& label) {
  int pid = static_cast<int>(::getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return (std::filesystem::temp_directory_path() /
          ("ft_mpi_trace_test_" + std::to_string(pid) + "_" + label))
      .string();
}

// Trains a small GPT (two layers, so backward after the first bucket is long enough to hide an
// allreduce) with small buckets, and returns the trace rank 0 wrote (null on other ranks).
nlohmann::json traced_run(MpiCommunicator& comm, bool overlap) {
  const std::string dir = shared_dir(overlap ? "overlap" : "no_overlap");
  TrainArgs args;
  args.config_path = std::string(FT_SOURCE_DIR) + "/configs/gpt_tiny.yaml";
  args.overrides = {"data.path=" + std::string(FT_SOURCE_DIR) + "/data/moby_dick.txt",
                    "model.n_layer=2",
                    "model.n_head=2",
                    "model.d_model=128",
                    "model.seq_len=64",
                    "train.batch_size=8",
                    "train.threads=1",
                    "train.steps=" + std::to_string(kLastStep),
                    "optim.warmup_steps=1",
                    "train.eval_every=0",
                    "train.eval_batches=1",
                    "comm.bucketing=true",
                    "comm.bucket_mb=0.5",
                    "comm.first_bucket_mb=0.1",
                    std::string("comm.overlap=") + (overlap ? "true" : "false"),
                    "train.run_dir=" + dir,
                    "train.checkpoint_dir=" + dir + "/checkpoints",
                    "train.trace=" + dir + "/trace.json"};
  EXPECT_EQ(run_train(args, &comm), 0);
  nlohmann::json trace;
  if (comm.rank() == 0) trace = load_trace(dir + "/trace.json");
  comm.barrier();
  if (comm.rank() == 0 && !std::getenv("FT_KEEP_TRACE")) std::filesystem::remove_all(dir);
  return trace;
}

// The end of the last backward op of `step` on one rank.
double backward_end_us(const std::vector<Slice>& compute, int step) {
  double end = -1;
  for (const Slice& slice : in_step(compute, step)) {
    if (slice.cat == "backward") end = std::max(end, slice.end());
  }
  return end;
}

// Checks shared by both modes; returns the tracks for the placement checks.
SlicesByTrack check_every_bucket_on_every_rank(const nlohmann::json& trace, int world_size) {
  const SlicesByTrack tracks = load_slices(trace);
  EXPECT_EQ(static_cast<int>(tracks.size()), world_size) << "one process per rank";
  expect_well_formed(tracks, kFirstStep, kLastStep);
  std::vector<int64_t> rank0_bytes;
  for (const auto& [pid, by_tid] : tracks) {
    SCOPED_TRACE("rank " + std::to_string(pid));
    EXPECT_TRUE(pid >= 0 && pid < world_size);
    for (const Slice& step : by_tid.at(kStepsTid)) {
      SCOPED_TRACE("step " + std::to_string(step.step));
      const int buckets = step.args.at("buckets").get<int>();
      EXPECT_GE(buckets, 2) << "bucket_mb is small enough for several buckets";
      const std::vector<Slice> comm = in_step(by_tid.at(kCommTid), step.step);
      std::set<int> seen;
      std::vector<int64_t> bytes(static_cast<size_t>(buckets), 0);
      for (const Slice& slice : comm) {
        const int bucket = slice.args.at("bucket").get<int>();
        if (bucket < 0 || bucket >= buckets) {
          ADD_FAILURE() << "bucket " << bucket << " of " << buckets;
          continue;
        }
        EXPECT_TRUE(seen.insert(bucket).second) << "bucket " << bucket << " twice";
        bytes[static_cast<size_t>(bucket)] = slice.args.at("bytes").get<int64_t>();
        EXPECT_GT(bytes[static_cast<size_t>(bucket)], 0);
        EXPECT_LE(slice.args.at("launch_us").get<double>(), slice.ts + kSlackUs)
            << "a bucket starts after it is launched";
      }
      EXPECT_EQ(static_cast<int>(seen.size()), buckets) << "every bucket has a slice";
      if (rank0_bytes.empty()) rank0_bytes = bytes;
      EXPECT_EQ(bytes, rank0_bytes) << "ranks reduce the same buckets";
    }
  }
  return tracks;
}

TEST(MpiTrace, OverlapPutsBucketsUnderBackward) {
  MpiCommunicator comm;
  const nlohmann::json trace = traced_run(comm, true);
  if (comm.rank() != 0) return;
  const SlicesByTrack tracks = check_every_bucket_on_every_rank(trace, comm.size());
  for (const auto& [pid, by_tid] : tracks) {
    for (int step = kFirstStep; step <= kLastStep; ++step) {
      const double backward_end = backward_end_us(by_tid.at(kComputeTid), step);
      int under_backward = 0;
      for (const Slice& slice : in_step(by_tid.at(kCommTid), step)) {
        if (slice.ts < backward_end) ++under_backward;
      }
      EXPECT_GE(under_backward, 1)
          << "rank " << pid << " step " << step << ": no allreduce started under backward";
    }
  }
}

TEST(MpiTrace, NoOverlapPutsBucketsAfterBackward) {
  MpiCommunicator comm;
  const nlohmann::json trace = traced_run(comm, false);
  if (comm.rank() != 0) return;
  const SlicesByTrack tracks = check_every_bucket_on_every_rank(trace, comm.size());
  for (const auto& [pid, by_tid] : tracks) {
    for (int step = kFirstStep; step <= kLastStep; ++step) {
      const double backward_end = backward_end_us(by_tid.at(kComputeTid), step);
      ASSERT_GT(backward_end, 0);
      for (const Slice& slice : in_step(by_tid.at(kCommTid), step)) {
        EXPECT_GE(slice.args.at("launch_us").get<double>(), backward_end - kSlackUs)
            << "rank " << pid << " step " << step << ": " << slice.name
            << " launched during backward";
        EXPECT_GE(slice.ts, backward_end - kSlackUs) << "rank " << pid << " step " << step << ": "
                                                     << slice.name << " started during backward";
      }
    }
  }
}

}  // namespace
}  // namespace ft

int main(int argc, char** argv) {
  return ft::run_mpi_gtest(argc, argv);
}

// MpiCommunicator, the start-up checks and the bandwidth job over real MPI ranks (ctest: mpirun -np
// 2 and -np 3). Collectives are never skipped by an assertion: checks after them use EXPECT, so a
// failure on one rank cannot leave the others waiting.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/bandwidth.h"
#include "comm/mpi/fold_allreduce.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/mpi_test_main.h"
#include "comm/startup.h"
#include "core/check.h"
#include "core/device.h"

namespace ft {
namespace {

TEST(MpiComm, RankAndSize) {
  MpiCommunicator comm;
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  EXPECT_EQ(comm.rank(), world_rank);
  EXPECT_EQ(comm.size(), world_size);
  EXPECT_GE(comm.size(), 2) << "run under mpirun -np 2 or more";
  EXPECT_STREQ(comm.backend_name(), "mpi");
}

TEST(MpiComm, LocalRankOnOneNode) {
  MpiCommunicator comm;
  // mpirun here starts every rank on this machine, so local ranks equal world ranks, and
  // OMPI_COMM_WORLD_LOCAL_RANK (set by mpirun) must agree when present.
  EXPECT_EQ(comm.local_rank(), comm.rank());
  if (const char* env = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
    EXPECT_EQ(comm.local_rank(), std::atoi(env));
  }
}

std::vector<float> rank_values(int rank, size_t count) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = static_cast<float>(rank + 1) * 0.5f + i % 7;
  return values;
}

// sum over r of ((r + 1) / 2 + i % 7), computed in double then rounded: exact for these sizes.
float expected_sum(int size, size_t i) {
  double total = 0;
  for (int r = 0; r < size; ++r) total += (r + 1) * 0.5 + i % 7;
  return static_cast<float>(total);
}

TEST(MpiComm, AllreduceSumAndAverage) {
  MpiCommunicator comm;
  const size_t count = 1000;
  std::vector<float> sum = rank_values(comm.rank(), count);
  comm.allreduce(sum.data(), count, ReduceOp::kSum);
  std::vector<float> average = rank_values(comm.rank(), count);
  comm.allreduce(average.data(), count, ReduceOp::kAverage);
  for (size_t i = 0; i < count; ++i) {
    EXPECT_EQ(sum[i], expected_sum(comm.size(), i)) << "index " << i;
    EXPECT_FLOAT_EQ(average[i], expected_sum(comm.size(), i) / comm.size()) << "index " << i;
  }
  comm.allreduce(nullptr, 0, ReduceOp::kSum);  // empty is allowed
}

TEST(MpiComm, AsyncAllreduceThenWait) {
  MpiCommunicator comm;
  const size_t count = 1 << 16;
  std::vector<float> first = rank_values(comm.rank(), count);
  std::vector<float> second = rank_values(comm.rank(), count);
  auto first_handle = comm.allreduce_async(first.data(), count, ReduceOp::kSum);
  auto second_handle = comm.allreduce_async(second.data(), count, ReduceOp::kAverage);
  while (!second_handle->test()) {
  }
  EXPECT_TRUE(second_handle->test());  // stays complete
  first_handle->wait();
  first_handle->wait();  // waiting twice is harmless
  for (size_t i = 0; i < count; i += 997) {
    EXPECT_EQ(first[i], expected_sum(comm.size(), i));
    EXPECT_FLOAT_EQ(second[i], expected_sum(comm.size(), i) / comm.size());
  }
}

// Values whose sums round differently under different association, known on every rank.
float messy_value(int rank, size_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(rank) << 40);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  const float unit = static_cast<float>(x & 0xffffff) / 16777216.0f;
  return (unit - 0.5f) * (1.0f + static_cast<float>((x >> 24) % 1000));
}

std::vector<float> messy_values(int rank, size_t count) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = messy_value(rank, i);
  return values;
}

// Every element must be ((x_0 + x_1) + x_2) + ..., whether the buffer goes whole or in pieces
// (small pieces take the gather path, large ones the exchange, the largest spans two segments).
TEST(MpiComm, RankOrderSumIsALeftFoldWhateverTheSplit) {
  MpiCommunicator comm;
  const AllreduceOptions rank_order(ReduceOp::kSum, Summation::kRankOrder);
  const size_t count = FoldAllreduce::kSegmentFloats + 12345;
  // Folded from stored values: inlining messy_value into the sum would let the compiler fuse its
  // multiply with the add (one rounding fewer) and the reference would no longer be a plain fold.
  std::vector<float> fold(count, 0.0f);
  for (int r = 0; r < comm.size(); ++r) {
    const std::vector<float> values = messy_values(r, count);
    for (size_t i = 0; i < count; ++i) fold[i] += values[i];
  }
  std::vector<float> whole = messy_values(comm.rank(), count);
  comm.allreduce(whole.data(), count, rank_order);
  std::vector<float> pieces = messy_values(comm.rank(), count);
  size_t begin = 0;
  for (size_t piece : {size_t{1}, size_t{7}, size_t{2000}, size_t{99999}}) {
    comm.allreduce(pieces.data() + begin, piece, rank_order);
    begin += piece;
  }
  auto handle = comm.allreduce_async(pieces.data() + begin, count - begin, rank_order);
  while (!handle->test()) {
  }
  size_t whole_mismatches = 0, piece_mismatches = 0;
  for (size_t i = 0; i < count; ++i) {
    whole_mismatches += whole[i] != fold[i];
    piece_mismatches += pieces[i] != fold[i];
  }
  EXPECT_EQ(whole_mismatches, 0u);
  EXPECT_EQ(piece_mismatches, 0u);
}

TEST(MpiComm, NativeIsTheDefault) {
  const AllreduceOptions defaults;
  EXPECT_EQ(defaults.summation, Summation::kNative);
  EXPECT_EQ(defaults.op, ReduceOp::kSum);
  const AllreduceOptions from_op = ReduceOp::kAverage;
  EXPECT_EQ(from_op.summation, Summation::kNative);
  EXPECT_EQ(from_op.op, ReduceOp::kAverage);
}

TEST(MpiComm, RankOrderSumsAndAverages) {
  MpiCommunicator comm;
  const size_t count = 5000;
  std::vector<float> sum = rank_values(comm.rank(), count);
  comm.allreduce(sum.data(), count, {ReduceOp::kSum, Summation::kRankOrder});
  std::vector<float> average = rank_values(comm.rank(), count);
  comm.allreduce_async(average.data(), count, {ReduceOp::kAverage, Summation::kRankOrder})->wait();
  for (size_t i = 0; i < count; i += 101) {
    EXPECT_EQ(sum[i], expected_sum(comm.size(), i));
    EXPECT_FLOAT_EQ(average[i], expected_sum(comm.size(), i) / comm.size());
  }
}

// MPI does not promise that a native allreduce hands every rank the same bits, yet data
// parallelism needs identical replicas. Open MPI's algorithms (one rank reduces each element, or
// pairs add the same two partial sums) do; this checks it for messy values over message sizes
// that select different algorithms, blocking and nonblocking. Rank-order sums must too.
TEST(MpiComm, EveryRankGetsTheSameBits) {
  MpiCommunicator comm;
  for (Summation summation : {Summation::kNative, Summation::kRankOrder}) {
    for (size_t count : {size_t{1}, size_t{100}, size_t{3000}, size_t{70000}, size_t{1} << 20}) {
      for (bool async : {false, true}) {
        std::vector<float> values = messy_values(comm.rank(), count);
        if (async) {
          comm.allreduce_async(values.data(), count, {ReduceOp::kSum, summation})->wait();
        } else {
          comm.allreduce(values.data(), count, {ReduceOp::kSum, summation});
        }
        std::vector<float> root = values;
        comm.broadcast(root.data(), count, 0);
        size_t differing = 0;
        for (size_t i = 0; i < count; ++i) differing += root[i] != values[i];
        EXPECT_EQ(differing, 0u) << "rank " << comm.rank() << ", " << count << " floats, "
                                 << (summation == Summation::kNative ? "native" : "rank order")
                                 << (async ? ", async" : "");
      }
    }
  }
}

TEST(MpiComm, BroadcastFromEveryRoot) {
  MpiCommunicator comm;
  for (int root = 0; root < comm.size(); ++root) {
    std::vector<float> values = rank_values(comm.rank(), 33);
    comm.broadcast(values.data(), values.size(), root);
    EXPECT_EQ(values, rank_values(root, 33)) << "root " << root;
  }
  std::vector<float> one(1);
  EXPECT_THROW(comm.broadcast(one.data(), 1, comm.size()), Error);  // same on every rank
}

TEST(MpiComm, BarrierOrdersRanks) {
  MpiCommunicator comm;
  // Rank 0 publishes a value only after the barrier; nobody can pass it before everyone arrived,
  // so afterwards all see rank 0's broadcast (the barrier itself must simply return everywhere).
  comm.barrier();
  float token = comm.rank() == 0 ? 42.0f : 0.0f;
  comm.broadcast(&token, 1, 0);
  comm.barrier();
  EXPECT_EQ(token, 42.0f);
}

std::vector<std::pair<std::string, std::string>> sample_config(int rank, bool differ) {
  std::vector<std::pair<std::string, std::string>> config = {{"model.arch", "gpt"},
                                                             {"train.batch_size", "8"},
                                                             {"optim.lr", "0.001"},
                                                             {"comm.bucket_mb", "4"}};
  if (differ && rank == 1) {
    config[1].second = "16";
    config[3].second = "25";
  }
  return config;
}

TEST(MpiStartup, SameConfigPasses) {
  MpiCommunicator comm;
  EXPECT_NO_THROW(check_same_config(comm, sample_config(comm.rank(), false), "test.yaml"));
}

TEST(MpiStartup, DifferentConfigFailsOnEveryRankNamingTheKeys) {
  MpiCommunicator comm;
  std::string message;
  try {
    check_same_config(comm, sample_config(comm.rank(), true), "test.yaml");
  } catch (const Error& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("train.batch_size"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0 = '8', rank 1 = '16'"), std::string::npos) << message;
  EXPECT_NE(message.find("comm.bucket_mb"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0 = '4', rank 1 = '25'"), std::string::npos) << message;
  EXPECT_EQ(message.find("optim.lr"), std::string::npos) << message;
  EXPECT_NE(message.find("test.yaml"), std::string::npos) << message;
  // The communicator is still usable: nobody is stuck in a half-finished exchange.
  float one = 1.0f;
  comm.allreduce(&one, 1, ReduceOp::kSum);
  EXPECT_EQ(one, static_cast<float>(comm.size()));
}

TEST(MpiStartup, MissingKeyIsNamed) {
  MpiCommunicator comm;
  auto config = sample_config(comm.rank(), false);
  if (comm.rank() == comm.size() - 1) config.emplace_back("data.extra", "x=1\ny");
  std::string message;
  try {
    check_same_config(comm, config, "cfg");
  } catch (const Error& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("key 'data.extra': rank 0 = '<missing>'"), std::string::npos) << message;
}

TEST(MpiStartup, BroadcastParametersCopiesRankZero) {
  MpiCommunicator comm;
  ParamStore params;
  params.add("w", {4, 5}, ParamInit::kNormal, 1.0f, true);
  params.add_buffer("running_var", {3}, ParamInit::kOnes);
  params.allocate();
  params.initialize(100 + comm.rank());  // different on every rank
  params.flat_buffers().fill(static_cast<float>(comm.rank() + 7));
  broadcast_parameters(comm, params);
  ParamStore reference;
  reference.add("w", {4, 5}, ParamInit::kNormal, 1.0f, true);
  reference.add_buffer("running_var", {3}, ParamInit::kOnes);
  reference.allocate();
  reference.initialize(100);
  for (int64_t i = 0; i < 20; ++i) {
    EXPECT_EQ(params.flat_values().data()[i], reference.flat_values().data()[i]);
  }
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(params.flat_buffers().data()[i], 7.0f);
}

TEST(MpiBandwidth, SweepAndFusedTableReachTheJson) {
  MpiCommunicator comm;
  BandwidthArgs args;
  args.min_bytes = 4096;
  args.max_bytes = 65536;
  args.warmup = 1;
  args.iters = 2;
  args.peak_gbps = 10;  // given, so the test skips the memory-bandwidth probe
  args.json_path = (std::filesystem::temp_directory_path() /
                    ("ft_bandwidth_" + std::to_string(getpid()) + ".json"))
                       .string();
  EXPECT_EQ(run_bandwidth(comm, args), 0);
  if (comm.rank() != 0) return;  // only rank 0 writes
  std::ifstream file(args.json_path);
  ASSERT_TRUE(file.good()) << args.json_path;
  const nlohmann::json report = nlohmann::json::parse(file);
  std::filesystem::remove(args.json_path);
  EXPECT_EQ(report["ranks"], comm.size());
  EXPECT_EQ(report["peak_gbps"], 10.0);
  ASSERT_EQ(report["sweep"].size(), 5u);  // 4, 8, 16, 32, 64 KiB
  EXPECT_EQ(report["sweep"][4]["bytes"], 65536);
  const double factor = 2.0 * (comm.size() - 1) / comm.size();
  for (const auto& row : report["sweep"]) {
    EXPECT_GT(row["time_us"].get<double>(), 0.0);
    EXPECT_NEAR(row["busbw_gbps"].get<double>(), row["algbw_gbps"].get<double>() * factor, 1e-9);
    EXPECT_NEAR(row["utilization"].get<double>(), row["busbw_gbps"].get<double>() / 10.0, 1e-9);
    EXPECT_GT(row["deterministic_time_us"].get<double>(), 0.0);
    EXPECT_NEAR(row["deterministic_over_native"].get<double>(),
                row["deterministic_time_us"].get<double>() / row["time_us"].get<double>(), 1e-9);
    EXPECT_NEAR(
        row["deterministic_busbw_gbps"].get<double>() * row["deterministic_time_us"].get<double>(),
        row["busbw_gbps"].get<double>() * row["time_us"].get<double>(), 1e-6);
  }
  EXPECT_EQ(report["deterministic_same_call_as_native"], comm.size() == 2);
  EXPECT_EQ(report["device"], "cpu");
  EXPECT_EQ(report["staged_through_host"], false);
  // No listed size fits 4 * s <= 64 KiB, so one row of s = max_bytes / 4.
  ASSERT_EQ(report["fused"].size(), 1u);
  const auto& fused = report["fused"][0];
  EXPECT_EQ(fused["message_bytes"], 16384);
  EXPECT_NEAR(fused["separate_over_fused"].get<double>(),
              fused["separate_time_us"].get<double>() / fused["fused_time_us"].get<double>(), 1e-9);
}

TEST(MpiBandwidth, BadArgumentsNameTheFlag) {
  MpiCommunicator comm;
  BandwidthArgs args;
  args.min_bytes = 8;
  args.max_bytes = 4;
  try {
    run_bandwidth(comm, args);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("--max-bytes"), std::string::npos) << error.what();
  }
  BandwidthArgs huge;
  huge.min_bytes = huge.max_bytes = kBandwidthMaxMessageBytes + 4;  // refused before allocating
  try {
    run_bandwidth(comm, huge);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("at most 8589934592 (8 GiB)"), std::string::npos)
        << error.what();
  }
  BandwidthArgs backend;
  backend.backend = "gloo";
  try {
    run_bandwidth(comm, backend);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("--backend must be one of: mpi, nccl; got 'gloo'"),
              std::string::npos)
        << error.what();
  }
}

TEST(MpiBandwidth, CudaWithoutAGpuSaysWhy) {
  if (cuda_unusable_reason("x").empty()) GTEST_SKIP() << "a GPU is usable here";
  MpiCommunicator comm;
  for (const char* backend : {"mpi", "nccl"}) {
    BandwidthArgs args;
    args.backend = backend;
    args.device = "cuda";
    try {
      run_bandwidth(comm, args);
      ADD_FAILURE() << "no error";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("bandwidth --device cuda needs "), std::string::npos)
          << error.what();
    }
  }
}

// A world of one rank, to check that bandwidth refuses it.
class OneRank final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  const char* backend_name() const override { return "one-rank"; }
  void allreduce(float*, size_t, const AllreduceOptions&) override {}
  std::unique_ptr<CommHandle> allreduce_async(float*, size_t, const AllreduceOptions&) override {
    FT_FAIL("OneRank::allreduce_async is not expected");
  }
  void broadcast(float*, size_t, int) override {}
  void barrier() override {}
};

TEST(MpiBandwidth, OneRankIsRefused) {
  OneRank comm;
  BandwidthArgs args;
  args.peak_gbps = 10;
  try {
    run_bandwidth(comm, args);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("at least 2 ranks"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace ft

int main(int argc, char** argv) {
  return ft::run_mpi_gtest(argc, argv);
}

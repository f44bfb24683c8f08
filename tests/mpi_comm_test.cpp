// MpiCommunicator and the start-up checks over real MPI ranks (ctest: mpirun -np 2 and -np 3);
// the bandwidth job is in tests/mpi_bandwidth_test.cpp. Collectives are never skipped by an
// assertion: checks after them use EXPECT, so a failure on one rank cannot leave the others
// waiting.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "comm/mpi/fold_allreduce.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/startup.h"
#include "core/check.h"
#include "tests/mpi_test_main.h"

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

}  // namespace
}  // namespace ft

int main(int argc, char** argv) {
  return ft::run_mpi_gtest(argc, argv);
}

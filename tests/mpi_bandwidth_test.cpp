// The bandwidth job over real MPI ranks (ctest: mpirun -np 2 and -np 3): the sweep and fused
// tables reach the JSON, bad arguments name their flag, and cuda without a GPU or a world of one
// rank is refused. Split from tests/mpi_comm_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/jobs/bandwidth.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/check.h"
#include "core/device.h"
#include "tests/mpi_test_main.h"

namespace ft {
namespace {

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

// main() for the MPI test binaries (tests/mpi_*_test.cpp). Every rank runs every test; only rank 0
// prints the usual report, other ranks print just their failures (tagged with the rank); the exit
// status is non-zero on every rank when any rank failed, so mpirun and ctest see the failure
// whichever rank hit it. Thread safety: call once, from main().
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <exception>

#include "comm/mpi/mpi_runtime.h"

namespace ft {

// Prints failed assertions of a non-zero rank, since its default printer is removed.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "rank %d: [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(),
                   info.name());
    }
  }

 private:
  int rank_;
};

inline int run_mpi_gtest(int argc, char** argv) {
  try {
    MpiRuntime runtime(&argc, &argv);
    ::testing::InitGoogleTest(&argc, argv);
    if (runtime.world_rank() != 0) {
      ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new RankFailurePrinter(runtime.world_rank()));
    }
    const int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
    int any_failed = 0;
    MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (runtime.world_rank() == 0 && any_failed && !local_failed) {
      std::fprintf(stderr, "rank 0 passed, but another rank failed (see its output above)\n");
    }
    return any_failed;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    MpiRuntime::abort(1);
  }
}

}  // namespace ft

// GradSync over real MPI ranks (ctest: mpirun -np 2 and -np 3): every combination of bucketing,
// bucket_view and overlap gives exactly the expected average; call counts, bucket order across
// ranks, grad-accumulation micro-batches, reordering, the emulated link and a single rank.
// Gradient values are small dyadic fractions, so every partial sum is exact in float whatever
// order MPI adds in, and results can be compared with ==.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "comm/grad_sync.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/check.h"
#include "core/timer.h"
#include "tests/mpi_test_main.h"

namespace ft {
namespace {

// Forwards to a real communicator and counts allreduce calls (from any thread).
class CountingComm final : public Communicator {
 public:
  explicit CountingComm(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  int local_rank() const override { return inner_.local_rank(); }
  const char* backend_name() const override { return "counting"; }
  void allreduce(float* buffer, size_t count, const AllreduceOptions& options) override {
    ++allreduces;
    if (options.summation == Summation::kRankOrder) ++rank_order_allreduces;
    inner_.allreduce(buffer, count, options);
  }
  std::unique_ptr<CommHandle> allreduce_async(float* buffer, size_t count,
                                              const AllreduceOptions& options) override {
    ++allreduces;
    if (options.summation == Summation::kRankOrder) ++rank_order_allreduces;
    return inner_.allreduce_async(buffer, count, options);
  }
  void broadcast(float* buffer, size_t count, int root) override {
    inner_.broadcast(buffer, count, root);
  }
  void barrier() override { inner_.barrier(); }

  std::atomic<int> allreduces{0};
  std::atomic<int> rank_order_allreduces{0};  // those asking for Summation::kRankOrder

 private:
  Communicator& inner_;
};

// A world of one rank: collectives are identities.
class SoloComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  const char* backend_name() const override { return "solo"; }
  void allreduce(float*, size_t, const AllreduceOptions&) override { ++allreduces; }
  std::unique_ptr<CommHandle> allreduce_async(float*, size_t, const AllreduceOptions&) override {
    FT_FAIL("SoloComm::allreduce_async is not expected");
  }
  void broadcast(float*, size_t, int) override {}
  void barrier() override {}
  int allreduces = 0;
};

const std::vector<int64_t> kParamNumels = {1000, 3000, 500, 2000, 7, 4000, 1200, 300};

// Params of kParamNumels with a buffer in between (buffers are never reduced).
void build_store(ParamStore& store) {
  for (size_t i = 0; i < kParamNumels.size(); ++i) {
    store.add("p" + std::to_string(i), {kParamNumels[i]}, ParamInit::kZeros, 0.0f, true);
    if (i == 2) store.add_buffer("running_mean", {11}, ParamInit::kZeros);
  }
  store.allocate();
}

// Rank- and step-dependent gradient; a multiple of 1/8 below 64, so sums stay exact.
float local_grad(int rank, int step, int64_t i) {
  return static_cast<float>((rank + 1) * 0.25 + (i % 13) * 0.125 + step);
}

void fill_grads(ParamStore& store, int rank, int step, bool accumulate) {
  float* grads = store.flat_grads().data();
  for (int64_t i = 0; i < store.num_trainable_floats(); ++i) {
    grads[i] = (accumulate ? grads[i] : 0.0f) + local_grad(rank, step, i);
  }
}

// Announces each trainable param in `order`, sleeping `pause_ms` after each one.
void announce(GradSync& sync, const std::vector<ParamId>& order, double pause_ms) {
  for (ParamId id : order) {
    sync.on_grad_ready(id);
    if (pause_ms > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(pause_ms));
    }
  }
}

// scale * sum over ranks of the sum over `steps` of local_grad, as GradSync must produce it.
float expected(int size, const std::vector<int>& steps, int64_t i, float scale) {
  double total = 0;
  for (int r = 0; r < size; ++r) {
    for (int step : steps) total += local_grad(r, step, i);
  }
  return static_cast<float>(total) * scale;
}

int64_t count_mismatches(ParamStore& store, int size, const std::vector<int>& steps, float scale) {
  int64_t mismatches = 0;
  const float* grads = store.flat_grads().data();
  for (int64_t i = 0; i < store.num_trainable_floats(); ++i) {
    if (grads[i] != expected(size, steps, i, scale)) ++mismatches;
  }
  return mismatches;
}

// Buckets' (first param, offset, count) from rank 0, compared with this rank's.
bool same_buckets_as_rank0(Communicator& comm, const std::vector<Bucket>& buckets) {
  std::vector<float> mine;
  for (const Bucket& bucket : buckets) {
    mine.insert(mine.end(), {static_cast<float>(bucket.params.front()),
                             static_cast<float>(bucket.offset), static_cast<float>(bucket.count)});
  }
  float count = static_cast<float>(mine.size());
  comm.broadcast(&count, 1, 0);
  std::vector<float> root = mine;
  root.resize(static_cast<size_t>(count));
  comm.broadcast(root.data(), root.size(), 0);
  return root == mine;
}

GradSyncOptions small_buckets() {
  GradSyncOptions options;
  options.bucket_mb = 0.01;         // 2621 floats
  options.first_bucket_mb = 0.004;  // 1048 floats
  return options;
}

struct Combo {
  bool bucketing, bucket_view, overlap, emulate;
};

class GradSyncCombos : public ::testing::TestWithParam<Combo> {};

TEST_P(GradSyncCombos, ExactAverageAndCallCounts) {
  const Combo combo = GetParam();
  MpiCommunicator mpi;
  CountingComm comm(mpi);
  ParamStore store;
  build_store(store);
  GradSyncOptions options = small_buckets();
  options.bucketing = combo.bucketing;
  options.bucket_view = combo.bucket_view;
  options.overlap = combo.overlap;
  if (combo.emulate) {
    options.emulate.latency_us = 3000;
    options.emulate.bandwidth_gbps = 0.1;  // 40 KB bucket → +3.2 ms
  }
  const std::vector<ParamId> order = reverse_registration_order(store);
  GradSync sync(comm, store, order, options);
  const int buckets = static_cast<int>(sync.buckets().size());
  if (combo.bucketing) {
    EXPECT_GT(buckets, 1);
    EXPECT_LT(buckets, static_cast<int>(kParamNumels.size()));
  } else {
    EXPECT_EQ(buckets, static_cast<int>(kParamNumels.size()));
  }
  EXPECT_TRUE(same_buckets_as_rank0(mpi, sync.buckets()));

  const float scale = 1.0f / static_cast<float>(comm.size());
  for (int step = 0; step < 2; ++step) {
    fill_grads(store, comm.rank(), step, false);
    comm.allreduces = 0;
    comm.rank_order_allreduces = 0;
    sync.begin_backward(true);
    announce(sync, order, 0.3);
    sync.finish(scale);
    EXPECT_EQ(count_mismatches(store, comm.size(), {step}, scale), 0) << "step " << step;
    const CommStepStats& stats = sync.last_stats();
    EXPECT_EQ(comm.allreduces.load(), buckets);
    EXPECT_EQ(comm.rank_order_allreduces.load(), 0);  // native is the default
    EXPECT_EQ(stats.allreduce_calls, buckets);
    EXPECT_EQ(static_cast<int>(stats.bucket_bytes.size()), buckets);
    EXPECT_EQ(stats.bytes_reduced, store.num_trainable_floats() * 4);
    EXPECT_EQ(stats.extra_memory_bytes, combo.bucket_view ? 0 : store.num_trainable_floats() * 4);
    EXPECT_EQ(stats.emulated, combo.emulate);
    // Exposed is the part of comm_ms after finish() entry: all of it when every bucket runs
    // inline, at most all of it when overlapped; scaling and copy-out count as neither.
    EXPECT_GT(stats.comm_ms, 0.0);
    EXPECT_GE(stats.exposed_ms, 0.0);
    if (combo.overlap)
      EXPECT_LE(stats.exposed_ms, stats.comm_ms);
    else
      EXPECT_EQ(stats.exposed_ms, stats.comm_ms);
    if (combo.emulate) {
      double floor_ms = 0;
      for (int64_t bytes : stats.bucket_bytes) floor_ms += options.emulate.extra_us(bytes) / 1e3;
      EXPECT_GE(stats.comm_ms, floor_ms);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllModes, GradSyncCombos,
    ::testing::Values(Combo{false, false, false, false}, Combo{false, false, true, false},
                      Combo{false, true, false, false}, Combo{false, true, true, false},
                      Combo{true, false, false, false}, Combo{true, false, true, false},
                      Combo{true, true, false, false}, Combo{true, true, true, false},
                      Combo{true, true, true, true}),
    [](const ::testing::TestParamInfo<Combo>& info) {
      const Combo& c = info.param;
      return std::string(c.bucketing ? "Bucketed" : "PerTensor") +
             (c.bucket_view ? "View" : "Fusion") + (c.overlap ? "Overlap" : "NoOverlap") +
             (c.emulate ? "Emulated" : "");
    });

// Overlap must start the first bucket while "backward" is still announcing; without overlap
// nothing is reduced before finish().
TEST(GradSync, OverlapLaunchesBeforeFinish) {
  MpiCommunicator mpi;
  for (bool overlap : {false, true}) {
    CountingComm comm(mpi);
    ParamStore store;
    build_store(store);
    GradSyncOptions options = small_buckets();
    options.overlap = overlap;
    const std::vector<ParamId> order = reverse_registration_order(store);
    GradSync sync(comm, store, order, options);
    comm.allreduces = 0;  // the constructor's layout check is not a gradient collective
    fill_grads(store, comm.rank(), 0, false);
    sync.begin_backward(true);
    announce(sync, sync.buckets().front().params, 0);
    const double deadline_ms = now_ms() + 2000;
    while (overlap && comm.allreduces.load() == 0 && now_ms() < deadline_ms) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const int started_before_rest = comm.allreduces.load();
    std::vector<ParamId> rest(order.begin() + sync.buckets().front().params.size(), order.end());
    announce(sync, rest, 0);
    sync.finish(0.5f);
    EXPECT_EQ(started_before_rest, overlap ? 1 : 0) << "overlap " << overlap;
    EXPECT_EQ(count_mismatches(store, comm.size(), {0}, 0.5f), 0);
  }
}

// deterministic = true asks for rank-order sums on every gradient allreduce, whether the training
// thread runs it (no overlap) or the comm thread does (overlap); the sums are still exact.
TEST(GradSync, DeterministicAsksForRankOrderOnBothPaths) {
  MpiCommunicator mpi;
  for (bool overlap : {false, true}) {
    for (bool deterministic : {false, true}) {
      CountingComm comm(mpi);
      ParamStore store;
      build_store(store);
      GradSyncOptions options = small_buckets();
      options.overlap = overlap;
      options.deterministic = deterministic;
      const std::vector<ParamId> order = reverse_registration_order(store);
      GradSync sync(comm, store, order, options);
      comm.allreduces = 0;  // the constructor's layout check is not a gradient collective
      comm.rank_order_allreduces = 0;
      fill_grads(store, comm.rank(), 0, false);
      sync.begin_backward(true);
      announce(sync, order, 0);
      sync.finish(0.5f);
      const int buckets = static_cast<int>(sync.buckets().size());
      EXPECT_EQ(comm.allreduces.load(), buckets);
      EXPECT_EQ(comm.rank_order_allreduces.load(), deterministic ? buckets : 0)
          << "overlap " << overlap << " deterministic " << deterministic;
      EXPECT_EQ(count_mismatches(store, comm.size(), {0}, 0.5f), 0);
    }
  }
}

TEST(GradSync, AccumulationMicroBatchesIssueNoCollectives) {
  MpiCommunicator mpi;
  CountingComm comm(mpi);
  ParamStore store;
  build_store(store);
  const std::vector<ParamId> order = reverse_registration_order(store);
  GradSync sync(comm, store, order, small_buckets());
  comm.allreduces = 0;  // the constructor's layout check is not a gradient collective
  const int micro_batches = 3;
  const float scale = 1.0f / static_cast<float>(comm.size() * micro_batches);
  store.zero_grads();
  for (int micro = 0; micro < micro_batches; ++micro) {
    fill_grads(store, comm.rank(), micro, true);
    const bool last = micro == micro_batches - 1;
    sync.begin_backward(last);
    announce(sync, order, 0);
    if (!last) {
      sync.finish(scale);  // a no-op for a non-communicating micro-batch
      EXPECT_EQ(comm.allreduces.load(), 0) << "micro-batch " << micro;
      EXPECT_EQ(sync.last_stats().allreduce_calls, 0);
    }
  }
  sync.finish(scale);
  EXPECT_EQ(comm.allreduces.load(), static_cast<int>(sync.buckets().size()));
  EXPECT_EQ(count_mismatches(store, comm.size(), {0, 1, 2}, scale), 0);
}

TEST(GradSync, ReorderUsesRankZeroObservedOrder) {
  MpiCommunicator mpi;
  ParamStore store;
  build_store(store);
  GradSyncOptions options = small_buckets();
  options.reorder_buckets = true;
  const std::vector<ParamId> reverse = reverse_registration_order(store);
  const std::vector<ParamId> forward(reverse.rbegin(), reverse.rend());
  // Ranks disagree on the order they see; rank 0's must win everywhere.
  const std::vector<ParamId>& seen = mpi.rank() == 0 ? forward : reverse;
  GradSync sync(mpi, store, reverse, options);
  EXPECT_EQ(sync.buckets().front().params.front(), reverse.front());
  for (int step = 0; step < 2; ++step) {
    fill_grads(store, mpi.rank(), step, false);
    sync.begin_backward(true);
    announce(sync, seen, 0.2);
    sync.finish(1.0f);
    EXPECT_EQ(count_mismatches(store, mpi.size(), {step}, 1.0f), 0) << "step " << step;
    EXPECT_EQ(sync.buckets().front().params.front(), forward.front()) << "step " << step;
    EXPECT_TRUE(same_buckets_as_rank0(mpi, sync.buckets()));
  }
}

TEST(GradSync, UnannouncedParamsAreReducedAtFinish) {
  MpiCommunicator mpi;
  ParamStore store;
  build_store(store);
  const std::vector<ParamId> order = reverse_registration_order(store);
  GradSync sync(mpi, store, order, small_buckets());
  fill_grads(store, mpi.rank(), 0, false);
  sync.begin_backward(true);
  announce(sync, std::vector<ParamId>(order.begin(), order.begin() + 3), 0);
  sync.finish(1.0f);
  EXPECT_EQ(count_mismatches(store, mpi.size(), {0}, 1.0f), 0);
}

TEST(GradSync, SingleRankScalesOnly) {
  SoloComm solo;
  ParamStore store;
  build_store(store);
  for (bool view : {false, true}) {
    GradSyncOptions options = small_buckets();
    options.bucket_view = view;
    options.emulate.latency_us = 1000;
    GradSync sync(solo, store, reverse_registration_order(store), options);
    fill_grads(store, 0, 0, false);
    sync.begin_backward(true);
    announce(sync, reverse_registration_order(store), 0);
    sync.finish(0.25f);
    EXPECT_EQ(count_mismatches(store, 1, {0}, 0.25f), 0);
    EXPECT_EQ(solo.allreduces, 0);
    EXPECT_EQ(sync.last_stats().allreduce_calls, 0);
    EXPECT_EQ(sync.last_stats().extra_memory_bytes, 0);
    EXPECT_FALSE(sync.last_stats().emulated);
    EXPECT_EQ(sync.last_stats().bucket_bytes.size(), sync.buckets().size());
  }
}

TEST(GradSync, MisuseIsReported) {
  SoloComm solo;
  ParamStore store;
  build_store(store);
  GradSync sync(solo, store, reverse_registration_order(store), small_buckets());
  EXPECT_THROW(sync.on_grad_ready(0), Error);  // outside a backward
  EXPECT_THROW(sync.finish(1.0f), Error);
  sync.begin_backward(true);
  sync.on_grad_ready(0);
  EXPECT_THROW(sync.on_grad_ready(0), Error);  // twice
  EXPECT_THROW(sync.on_grad_ready(3), Error);  // the buffer
  EXPECT_THROW(sync.begin_backward(true), Error);
  sync.finish(1.0f);
  GradSyncOptions bad = small_buckets();
  bad.emulate.latency_us = -1;
  EXPECT_THROW(GradSync(solo, store, {}, bad), Error);
}

}  // namespace
}  // namespace ft

int main(int argc, char** argv) {
  return ft::run_mpi_gtest(argc, argv);
}

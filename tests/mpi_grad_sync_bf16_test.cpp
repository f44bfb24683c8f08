// GradSync with grad_dtype kBf16 over real ranks (ctest: mpirun -np 2 and -np 3), against the
// fp32 path on the same gradients, for bucketing, overlap, bucket_view and deterministic on/off.
// Gradients here are not dyadic, so the bf16 roundings show. Tolerance per element, with
// u = 2^-8 (half a bf16 ulp, relative) and S = sum over ranks of |g_r|: each rank's rounding to
// bf16 errs by at most u * |g_r|, and each of the n - 1 additions rounds once more, by at most
// u * S (partial sums never exceed S), so |bf16 path - fp32 path| <= n * u * S * |scale| * 1.01;
// the fp32 path's own error (n * 2^-24 * S) hides in the 1.01. Where the order of additions is
// known the result must match to the bit: two ranks (one addition), and rank order from three.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "comm/grad_sync.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/check.h"
#include "tests/mpi_test_main.h"

namespace ft {
namespace {

const std::vector<int64_t> kParamNumels = {1000, 3000, 500, 2000, 7, 4000, 1200, 300};

void build_store(ParamStore& store) {
  for (size_t i = 0; i < kParamNumels.size(); ++i) {
    store.add("p" + std::to_string(i), {kParamNumels[i]}, ParamInit::kZeros, 0.0f, true);
    if (i == 2) store.add_buffer("running_mean", {11}, ParamInit::kZeros);
  }
  store.allocate();
}

// Full-precision values of mixed sign and size: bf16 must round nearly all of them.
float local_grad(int rank, int step, int64_t i) {
  return static_cast<float>(std::sin(0.37 * i + 1.3 * rank + 0.7 * step) * (1 + i % 7) / 3.0);
}

void fill_grads(ParamStore& store, int rank, int step) {
  float* grads = store.flat_grads().data();
  for (int64_t i = 0; i < store.num_trainable_floats(); ++i) grads[i] = local_grad(rank, step, i);
}

std::vector<float> sync_once(Communicator& comm, const GradSyncOptions& options, int step,
                             float scale, CommStepStats* stats = nullptr) {
  ParamStore store;
  build_store(store);
  const std::vector<ParamId> order = reverse_registration_order(store);
  GradSync sync(comm, store, order, options);
  fill_grads(store, comm.rank(), step);
  sync.begin_backward(true);
  for (ParamId id : order) sync.on_grad_ready(id);
  sync.finish(scale);
  if (stats != nullptr) *stats = sync.last_stats();
  const float* grads = store.flat_grads().data();
  return std::vector<float>(grads, grads + store.num_trainable_floats());
}

// The bits the bf16 path must produce where the order of additions is fixed: rank order in fp32
// over the rounded gradients, one rounding, then the scale in fp32.
float rank_order_bf16(int ranks, int step, int64_t i, float scale) {
  float sum = round_to_bf16(local_grad(0, step, i));
  for (int r = 1; r < ranks; ++r) sum += round_to_bf16(local_grad(r, step, i));
  return round_to_bf16(sum) * scale;
}

struct Combo {
  bool bucketing, overlap, bucket_view, deterministic;
};

std::string combo_name(const Combo& c) {
  return std::string(c.bucketing ? "bucketed" : "per_tensor") +
         (c.overlap ? "_overlap" : "_inline") + (c.bucket_view ? "_view" : "_copy") +
         (c.deterministic ? "_rank_order" : "_native");
}

void PrintTo(const Combo& combo, std::ostream* out) {
  *out << combo_name(combo);
}

class GradSyncBf16 : public ::testing::TestWithParam<Combo> {};

TEST_P(GradSyncBf16, MatchesFp32PathWithinBf16Rounding) {
  const Combo combo = GetParam();
  MpiCommunicator comm;
  const int n = comm.size();
  GradSyncOptions options;
  options.bucket_mb = 0.01;  // several buckets
  options.first_bucket_mb = 0.004;
  options.bucketing = combo.bucketing;
  options.overlap = combo.overlap;
  options.bucket_view = combo.bucket_view;
  options.deterministic = combo.deterministic;
  const float scale = 1.0f / static_cast<float>(n);
  for (int step = 0; step < 2; ++step) {
    const std::vector<float> fp32 = sync_once(comm, options, step, scale);
    GradSyncOptions bf16_options = options;
    bf16_options.grad_dtype = CommDtype::kBf16;
    CommStepStats stats;
    const std::vector<float> bf16 = sync_once(comm, bf16_options, step, scale, &stats);
    ASSERT_EQ(bf16.size(), fp32.size());
    const bool exact = n == 2 || combo.deterministic;
    int64_t off_bound = 0, off_bits = 0, changed = 0;
    for (size_t i = 0; i < bf16.size(); ++i) {
      double magnitude = 0;
      for (int r = 0; r < n; ++r) magnitude += std::fabs(local_grad(r, step, i));
      const double bound = n * std::ldexp(1.0, -8) * magnitude * scale * 1.01;
      if (std::fabs(static_cast<double>(bf16[i]) - fp32[i]) > bound) ++off_bound;
      if (exact && bf16[i] != rank_order_bf16(n, step, static_cast<int64_t>(i), scale)) ++off_bits;
      if (bf16[i] != fp32[i]) ++changed;
    }
    EXPECT_EQ(off_bound, 0) << "step " << step;
    EXPECT_EQ(off_bits, 0) << "step " << step;
    EXPECT_GT(changed, static_cast<int64_t>(bf16.size()) / 2) << "bf16 rounding must show";
    // Half the bytes on the wire; the bf16 image replaces the fusion buffer.
    const int64_t floats = static_cast<int64_t>(bf16.size());
    EXPECT_EQ(stats.bytes_reduced, floats * 2);
    int64_t bucket_total = 0;
    for (int64_t bytes : stats.bucket_bytes) bucket_total += bytes;
    EXPECT_EQ(bucket_total, floats * 2);
    EXPECT_EQ(stats.extra_memory_bytes, floats * 2);
    EXPECT_EQ(stats.allreduce_calls, static_cast<int64_t>(stats.bucket_bytes.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Combos, GradSyncBf16,
    ::testing::Values(Combo{false, false, true, false}, Combo{false, true, true, false},
                      Combo{true, false, true, false}, Combo{true, true, true, false},
                      Combo{true, false, false, false}, Combo{true, true, false, false},
                      Combo{true, false, true, true}, Combo{true, true, false, true},
                      Combo{false, true, true, true}),
    [](const ::testing::TestParamInfo<Combo>& info) { return combo_name(info.param); });

// The emulated link charges what is sent: one bucket of N gradients costs 2N bytes' worth of
// delay, not 4N. The link is set so 2N bytes take 80 ms and 4N would take 160 ms.
TEST(GradSyncBf16Link, EmulatedLinkChargesHalfTheBytes) {
  MpiCommunicator comm;
  GradSyncOptions options;
  options.bucket_mb = 1;  // every gradient in one bucket
  options.first_bucket_mb = 1;
  options.overlap = false;
  options.grad_dtype = CommDtype::kBf16;
  int64_t floats = 0;
  for (int64_t numel : kParamNumels) floats += numel;
  options.emulate.bandwidth_gbps = 100;
  CommStepStats stats;
  sync_once(comm, options, 0, 1.0f, &stats);
  ASSERT_EQ(stats.bucket_bytes.size(), 1u);
  EXPECT_TRUE(stats.emulated);
  // The link's delay and this figure are both GradSync's wire_bytes(bucket): 2 bytes a gradient,
  // not fp32's 4 (checked on the bytes, not on a timing).
  EXPECT_EQ(stats.bucket_bytes[0], 2 * floats);
}

// One rank: the bf16 round trip runs only when asked (single_rank_allreduce), and is then visible.
class SoloBf16 final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  const char* backend_name() const override { return "solo-bf16"; }
  void allreduce(float*, size_t, const AllreduceOptions&) override { ++float_calls; }
  std::unique_ptr<CommHandle> allreduce_async(float*, size_t, const AllreduceOptions&) override {
    FT_FAIL("SoloBf16::allreduce_async is not expected");
  }
  void allreduce_bf16(bf16_bits*, size_t, const AllreduceOptions&) override { ++bf16_calls; }
  void broadcast(float*, size_t, int) override {}
  void barrier() override {}
  int float_calls = 0, bf16_calls = 0;
};

TEST(GradSyncBf16Solo, SingleRankAllreduceRoundTripsThroughBf16) {
  for (bool asked : {false, true}) {
    SoloBf16 solo;
    GradSyncOptions options;
    options.grad_dtype = CommDtype::kBf16;
    options.single_rank_allreduce = asked;
    const std::vector<float> grads = sync_once(solo, options, 0, 0.5f);
    int64_t off = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      const float g = local_grad(0, 0, static_cast<int64_t>(i));
      if (grads[i] != (asked ? round_to_bf16(g) : g) * 0.5f) ++off;
    }
    EXPECT_EQ(off, 0) << (asked ? "asked" : "default");
    EXPECT_EQ(solo.float_calls, 0);
    EXPECT_EQ(solo.bf16_calls > 0, asked);
  }
}

}  // namespace
}  // namespace ft

int main(int argc, char** argv) {
  return ft::run_mpi_gtest(argc, argv);
}

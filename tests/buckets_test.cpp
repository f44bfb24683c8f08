// Gradient bucket assignment: caps, the first-bucket cap, no split parameters, oversize params
// alone, every parameter exactly once, contiguous ranges, determinism.
#include "comm/buckets.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/check.h"

namespace ft {
namespace {

constexpr int64_t kFloatsPerMiB = 1024 * 1024 / 4;

// Registers params of `numels` floats (plus one buffer, which must never land in a bucket).
void fill_store(ParamStore& store, const std::vector<int64_t>& numels) {
  for (size_t i = 0; i < numels.size(); ++i) {
    store.add("p" + std::to_string(i), {numels[i]}, ParamInit::kZeros, 0.0f, true);
    if (i == 1) store.add_buffer("running_mean", {7}, ParamInit::kZeros);
  }
  store.allocate();
}

int64_t numel_of(const ParamStore& store, ParamId id) {
  return shape_numel(store[id].shape);
}

// Every trainable param exactly once; every bucket a contiguous range its params tile exactly.
void expect_partition(const ParamStore& store, const std::vector<Bucket>& buckets) {
  std::multiset<ParamId> seen;
  for (const Bucket& bucket : buckets) {
    ASSERT_FALSE(bucket.params.empty());
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (ParamId id : bucket.params) {
      seen.insert(id);
      EXPECT_TRUE(store[id].trainable) << store[id].name;
      ranges.emplace_back(store[id].offset, numel_of(store, id));
    }
    std::sort(ranges.begin(), ranges.end());
    int64_t cursor = bucket.offset;
    for (const auto& [offset, count] : ranges) {
      EXPECT_EQ(offset, cursor) << "bucket at " << bucket.offset << " is not contiguous";
      cursor = offset + count;
    }
    EXPECT_EQ(cursor, bucket.offset + bucket.count);
  }
  int trainable = 0;
  for (ParamId id = 0; id < store.size(); ++id) {
    if (!store[id].trainable) continue;
    ++trainable;
    EXPECT_EQ(seen.count(id), 1u) << store[id].name;
  }
  EXPECT_EQ(static_cast<int>(seen.size()), trainable);
}

TEST(Buckets, CapsHoldAndFirstBucketIsSmaller) {
  ParamStore store;
  // 20 params of 0.25 MiB each: cap 1 MiB → 4 per bucket; first cap 0.5 MiB → 2.
  fill_store(store, std::vector<int64_t>(20, kFloatsPerMiB / 4));
  const std::vector<Bucket> buckets = assign_buckets(store, {}, 1.0, 0.5);
  expect_partition(store, buckets);
  ASSERT_EQ(buckets.size(), 1u + 18u / 4u + 1u);  // 2, then 4,4,4,4, then 2
  EXPECT_EQ(buckets[0].count, kFloatsPerMiB / 2);
  for (size_t b = 1; b < buckets.size(); ++b) EXPECT_LE(buckets[b].count, kFloatsPerMiB);
  EXPECT_EQ(buckets[1].count, kFloatsPerMiB);
}

TEST(Buckets, DefaultOrderIsReverseRegistration) {
  ParamStore store;
  fill_store(store, {10, 20, 30, 40});
  const std::vector<Bucket> buckets = assign_buckets(store, {}, 1.0, 1.0);
  ASSERT_EQ(buckets.size(), 1u);
  const std::vector<ParamId> expected = reverse_registration_order(store);
  EXPECT_EQ(buckets[0].params, expected);
  EXPECT_EQ(buckets[0].offset, 0);
  EXPECT_EQ(buckets[0].count, 100);
  // The buffer (id 2) sits between p1 and p2 in registration but has no gradient.
  EXPECT_EQ(std::count(expected.begin(), expected.end(), 2), 0);
}

TEST(Buckets, OversizeParamGetsItsOwnBucket) {
  ParamStore store;
  fill_store(store, {kFloatsPerMiB / 8, 3 * kFloatsPerMiB, kFloatsPerMiB / 8, kFloatsPerMiB / 8});
  const std::vector<Bucket> buckets = assign_buckets(store, {}, 1.0, 1.0);
  expect_partition(store, buckets);
  // Reverse order: p3, p2 share; p1 (3 MiB) alone and whole; p0 in a new bucket.
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].params, (std::vector<ParamId>{4, 3}));
  EXPECT_EQ(buckets[1].params, (std::vector<ParamId>{1}));
  EXPECT_EQ(buckets[1].count, 3 * kFloatsPerMiB);
  EXPECT_EQ(buckets[2].params, (std::vector<ParamId>{0}));
}

// A cap of `floats` floats, in MiB.
double mib(int64_t floats) {
  return static_cast<double>(floats) * 4 / (1024.0 * 1024.0);
}

TEST(Buckets, BackwardOrderWithinOpsPacksWholeOps) {
  ParamStore store;
  // Like GPT: (weight, bias) per op; backward announces ops in reverse, each op's params in
  // registration order, so a bucket has a hole (the bias) until the op's last param arrives.
  fill_store(store, {100, 10, 200, 20, 300, 30});  // ids 0, 1, (2 buffer), 3, 4, 5, 6
  const std::vector<ParamId> order = {5, 6, 3, 4, 0, 1};
  const std::vector<Bucket> buckets = assign_buckets(store, order, mib(600), mib(600));
  expect_partition(store, buckets);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].params, (std::vector<ParamId>{5, 6, 3, 4}));
  EXPECT_EQ(buckets[0].offset, 110);
  EXPECT_EQ(buckets[0].count, 550);
  EXPECT_EQ(buckets[1].params, (std::vector<ParamId>{0, 1}));
}

TEST(Buckets, ScrambledOrderStaysContiguous) {
  ParamStore store;
  fill_store(store, {100, 100, 100, 100, 100, 100});
  // Trainable ids 0, 1, 3, 4, 5, 6 at offsets 0, 100, ..., 500 (2 is the buffer).
  // Cap 300: {6}; then 3 and 5 leave a hole that 4 fills; then {0, 1}.
  std::vector<Bucket> buckets = assign_buckets(store, {6, 3, 5, 4, 0, 1}, mib(300), mib(300));
  expect_partition(store, buckets);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].params, (std::vector<ParamId>{6}));
  EXPECT_EQ(buckets[1].params, (std::vector<ParamId>{3, 5, 4}));
  EXPECT_EQ(buckets[1].offset, 200);
  EXPECT_EQ(buckets[2].params, (std::vector<ParamId>{0, 1}));
  // Here {6, 4} closes with 5's hole unfilled, and {5, 3} with 4's (already taken): each splits
  // into runs, launched in the order they complete (5 is ready before 3).
  buckets = assign_buckets(store, {6, 4, 0, 5, 3, 1}, mib(300), mib(300));
  expect_partition(store, buckets);
  ASSERT_EQ(buckets.size(), 6u);
  const std::vector<std::vector<ParamId>> expected = {{6}, {4}, {0}, {5}, {3}, {1}};
  for (size_t b = 0; b < buckets.size(); ++b) EXPECT_EQ(buckets[b].params, expected[b]) << b;
}

TEST(Buckets, RunsLaunchInCompletionOrder) {
  ParamStore store;
  fill_store(store, {100, 100, 100, 100});  // ids 0, 1, 3, 4 at offsets 0, 100, 200, 300
  // {1, 4} closes (0 would break the cap) with 3's hole unfilled: runs {1} and {4}, in the order
  // they complete. {0, 3} ends with 1's hole, already taken: runs {0} and {3}.
  std::vector<Bucket> buckets = assign_buckets(store, {1, 4, 0, 3}, mib(300), mib(300));
  expect_partition(store, buckets);
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(buckets[0].params, (std::vector<ParamId>{1}));
  EXPECT_EQ(buckets[1].params, (std::vector<ParamId>{4}));
  EXPECT_EQ(buckets[2].params, (std::vector<ParamId>{0}));
  EXPECT_EQ(buckets[3].params, (std::vector<ParamId>{3}));
}

// Random sizes, random ready orders, random caps: a valid partition into contiguous ranges, caps
// hold (but for a lone oversize param), and each bucket completes no later than the next.
TEST(Buckets, PropertiesHoldForRandomOrders) {
  uint64_t state = 12345;
  auto next = [&](uint64_t bound) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % bound;
  };
  for (int trial = 0; trial < 200; ++trial) {
    ParamStore store;
    std::vector<int64_t> numels(2 + next(12));
    for (int64_t& numel : numels) numel = 1 + static_cast<int64_t>(next(400));
    fill_store(store, numels);
    std::vector<ParamId> order = reverse_registration_order(store);
    for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[next(i + 1)]);
    const int64_t cap = 1 + static_cast<int64_t>(next(900));
    const int64_t first_cap = 1 + static_cast<int64_t>(next(cap));  // config: at most bucket_mb
    const std::vector<Bucket> buckets = assign_buckets(store, order, mib(cap), mib(first_cap));
    expect_partition(store, buckets);
    std::vector<size_t> position(static_cast<size_t>(store.size()));
    for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
    size_t previous_completion = 0;
    for (size_t b = 0; b < buckets.size(); ++b) {
      const int64_t limit = b == 0 ? first_cap : cap;
      if (buckets[b].params.size() > 1) {
        EXPECT_LE(buckets[b].count, limit) << "trial " << trial;
      }
      size_t completion = 0;
      for (ParamId id : buckets[b].params) completion = std::max(completion, position[id]);
      EXPECT_GE(completion, previous_completion) << "trial " << trial << " bucket " << b;
      previous_completion = completion;
    }
  }
}

TEST(Buckets, MissingParamsAreAppendedAndDuplicatesRejected) {
  ParamStore store;
  fill_store(store, {10, 10, 10});
  const std::vector<Bucket> buckets = assign_buckets(store, {3}, 1.0, 1.0);
  expect_partition(store, buckets);
  EXPECT_EQ(buckets.front().params.front(), 3);
  EXPECT_THROW(assign_buckets(store, {3, 3}, 1.0, 1.0), Error);
  EXPECT_THROW(assign_buckets(store, {2}, 1.0, 1.0), Error);  // the buffer
  EXPECT_THROW(assign_buckets(store, {}, 0.0, 1.0), Error);
}

TEST(Buckets, SingleParamBucketsOnePerTensor) {
  ParamStore store;
  fill_store(store, {5, 6, 7, 8});
  const std::vector<Bucket> buckets = single_param_buckets(store, {});
  expect_partition(store, buckets);
  ASSERT_EQ(buckets.size(), 4u);
  for (const Bucket& bucket : buckets) EXPECT_EQ(bucket.params.size(), 1u);
  EXPECT_EQ(buckets[0].count, 8);
}

TEST(Buckets, Deterministic) {
  ParamStore first, second;
  const std::vector<int64_t> numels = {3000, 70000, 1, 250000, 12345, 400000, 9};
  fill_store(first, numels);
  fill_store(second, numels);
  const std::string a = bucket_signature(assign_buckets(first, {}, 0.5, 0.25));
  const std::string b = bucket_signature(assign_buckets(second, {}, 0.5, 0.25));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, bucket_signature(assign_buckets(first, {}, 0.5, 2.0)));
  expect_partition(first, assign_buckets(first, {}, 0.5, 0.25));
}

}  // namespace
}  // namespace ft

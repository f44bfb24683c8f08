// The bf16 allreduce of MpiCommunicator over real ranks (ctest: mpirun -np 2 and -np 3), against
// references computed here from the same bf16 inputs (every rank can make every rank's input).
// Tolerance: a bf16 rounding errs by at most half an ulp, u = 2^-8 of the value rounded, so the
// native sum over n ranks, which rounds once per hop (n - 1 times), lies within
// (n - 1) * u * sum|x_r| * 1.01 of the exact sum (the 1.01 covers the errors' own growth). Two
// ranks add once: the result must be bf16(float(a) + float(b)) to the bit. Rank-order sums fold
// in fp32 and round once: bf16(((x_0 + x_1) + x_2) ...) to the bit, however the buffer is split.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "comm/mpi/bf16_reduction.h"
#include "comm/mpi/fold_allreduce.h"
#include "comm/mpi/mpi_communicator.h"
#include "tests/mpi_test_main.h"

namespace ft {
namespace {

// A bf16 value of varied sign and magnitude (2^-6 .. 2^6) with all 8 significant bits in use, so
// most sums need rounding and some are ties.
bf16_bits input(int rank, size_t i) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(rank + 1) * 40503u;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  const float mantissa = 1.0f + static_cast<float>(h & 0x7F) / 128.0f;
  const float value = std::ldexp(mantissa, static_cast<int>((h >> 7) % 13) - 6);
  return float_to_bf16((h >> 20) & 1 ? -value : value);
}

std::vector<bf16_bits> inputs(int rank, size_t count) {
  std::vector<bf16_bits> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = input(rank, i);
  return values;
}

// The rank-order fold's promise: fp32 sum in rank order, one rounding.
bf16_bits rank_order_sum(int ranks, size_t i) {
  float sum = bf16_to_float(input(0, i));
  for (int r = 1; r < ranks; ++r) sum += bf16_to_float(input(r, i));
  return float_to_bf16(sum);
}

TEST(Bf16Reduction, AddsInFp32AndRoundsOnce) {
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even (1). 1 + 3 * 2^-8 rounds up to 1 + 2^-6.
  const bf16_bits one = float_to_bf16(1.0f);
  std::vector<bf16_bits> in = {float_to_bf16(std::ldexp(1.0f, -8)),
                               float_to_bf16(3 * std::ldexp(1.0f, -8))};
  std::vector<bf16_bits> inout = {one, one};
  bf16_sum_into(in.data(), inout.data(), 2);
  EXPECT_EQ(bf16_to_float(inout[0]), 1.0f);
  EXPECT_EQ(bf16_to_float(inout[1]), 1.0f + std::ldexp(1.0f, -6));
}

TEST(Bf16Allreduce, NativeMatchesFp32ReferenceRoundedPerHop) {
  MpiCommunicator comm;
  const int n = comm.size();
  const size_t count = 100003;  // several of MPI's internal segments, odd
  std::vector<bf16_bits> values = inputs(comm.rank(), count);
  comm.allreduce_bf16(values.data(), count, ReduceOp::kSum);
  const double u = std::ldexp(1.0, -8);
  int64_t off_bound = 0, off_bits = 0;
  for (size_t i = 0; i < count; ++i) {
    double exact = 0, magnitude = 0;
    for (int r = 0; r < n; ++r) {
      exact += bf16_to_float(input(r, i));
      magnitude += std::fabs(bf16_to_float(input(r, i)));
    }
    const double got = bf16_to_float(values[i]);
    if (std::fabs(got - exact) > (n - 1) * u * magnitude * 1.01) ++off_bound;
    if (n == 2 && values[i] != rank_order_sum(2, i)) ++off_bits;
  }
  EXPECT_EQ(off_bound, 0);
  EXPECT_EQ(off_bits, 0) << "two ranks: bf16(float(a) + float(b)) exactly";
}

TEST(Bf16Allreduce, AsyncEqualsBlockingAndAverageScalesTheSum) {
  MpiCommunicator comm;
  const size_t count = 4099;
  std::vector<bf16_bits> blocking = inputs(comm.rank(), count);
  std::vector<bf16_bits> async = blocking, average = blocking;
  comm.allreduce_bf16(blocking.data(), count, ReduceOp::kSum);
  auto handle = comm.allreduce_bf16_async(async.data(), count, ReduceOp::kSum);
  auto average_handle = comm.allreduce_bf16_async(average.data(), count, ReduceOp::kAverage);
  handle->wait();
  average_handle->wait();
  const float inverse = 1.0f / static_cast<float>(comm.size());
  int64_t async_off = 0, average_off = 0;
  for (size_t i = 0; i < count; ++i) {
    if (async[i] != blocking[i]) ++async_off;
    if (average[i] != float_to_bf16(bf16_to_float(blocking[i]) * inverse)) ++average_off;
  }
  EXPECT_EQ(async_off, 0);
  EXPECT_EQ(average_off, 0);
}

// Whole, in pieces, blocking and async: every split gives the same bits, which are the fp32 fold
// rounded once. Crosses a fold segment and the send-everything threshold.
TEST(Bf16Allreduce, RankOrderIsExactAndIndependentOfSplits) {
  MpiCommunicator comm;
  const AllreduceOptions rank_order{ReduceOp::kSum, Summation::kRankOrder};
  const size_t count = FoldAllreduceBf16::kSegmentFloats + 4321;
  std::vector<bf16_bits> whole = inputs(comm.rank(), count);
  std::vector<bf16_bits> pieces = whole;
  comm.allreduce_bf16(whole.data(), count, rank_order);
  size_t begin = 0;
  for (size_t piece : {size_t{5}, size_t{2000}, size_t{123457}}) {
    comm.allreduce_bf16(pieces.data() + begin, piece, rank_order);
    begin += piece;
  }
  comm.allreduce_bf16_async(pieces.data() + begin, count - begin, rank_order)->wait();
  int64_t split_off = 0, reference_off = 0;
  for (size_t i = 0; i < count; ++i) {
    if (pieces[i] != whole[i]) ++split_off;
    if (whole[i] != rank_order_sum(comm.size(), i)) ++reference_off;
  }
  EXPECT_EQ(split_off, 0);
  EXPECT_EQ(reference_off, 0);
}

}  // namespace
}  // namespace ft

int main(int argc, char** argv) {
  return ft::run_mpi_gtest(argc, argv);
}
